/* The executable of a compiled step: runs it on .npy files (the same
   source for every step, which it knows through kiln_program.h; built
   with KILN_MPI=1 for a step of several ranks).
   usage: PROGRAM [--input NAME=FILE.npy]... [--inputs DIR|FILE.npz] [--seed N] --output-dir DIR [--steps N | --repeat N] [--report-time] [--report-memory] [--profile]
   An argument comes from --input NAME=FILE, else DIR/NAME.npy of --inputs
   (or the member NAME.npy of an .npz archive that numpy.savez wrote),
   else the init value the program embeds, else, with --seed N, values
   drawn from N (f64, f32, f16 and bf16 uniform in [-0.05, 0.05], other
   dtypes 0: a large model's step travels without its weights); --help
   lists them.
   --steps N runs N steps in a row, each from the state the last left (a
   training loop: arguments updated in place advance), and writes the
   last step's results and the final state;
   --repeat N runs the function N times (arguments updated in place are
   restored between runs, from a copy of each) and reports the mean time
   of one run on stderr;
   --report-time reports the mean time of a step of --steps too;
   --report-memory reports the peak resident bytes (VmHWM) on stderr (and
   for a CUDA program the device bytes, kiln_cuda_memory);
   --profile the time of every kernel (the runtime's kiln_profile). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if KILN_MPI
#include <mpi.h>
#endif

#include "kiln_program.h"
#include "kiln_runtime.h"

#if KILN_CUDA
/* The CUDA runtime's device bytes (kiln_cuda_runtime.cu). */
long long kiln_cuda_memory(kiln_step *s, int which);
#endif

typedef kiln_tensor_info tensor_t;
#define NPARAMS (kilnrt_program.nparams)
#define NINPUTS (kilnrt_program.ninputs)
#define NRESULTS (kilnrt_program.nresults)
#define params (kilnrt_program.tensors)
#define inputs (kilnrt_program.tensors + NPARAMS)
#define results (kilnrt_program.tensors + NPARAMS + NINPUTS)

/* put_text writes s with each control character shown as '?' (a name
   carrying an escape sequence reaches the terminal as text). */
static void put_text(FILE *f, const char *s) {
	for (; *s; s++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
}

static void report(const char *fmt, const char *a, const char *b, const char *tail) {
	char msg[8192];
	snprintf(msg, sizeof msg, fmt, a, b);
	fprintf(stderr, "error: ");
	put_text(stderr, msg);
	fprintf(stderr, "%s\n", tail);
}

static void die(const char *fmt, const char *a, const char *b) {
	report(fmt, a, b, "");
#if KILN_MPI
	/* The other ranks may wait in a collective for this one: end them
	   too, whatever launched the job. */
	int started = 0, ended = 0;
	MPI_Initialized(&started);
	MPI_Finalized(&ended);
	if (started && !ended) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
	exit(1);
}

/* misuse reports a command line the program cannot take: exit 2. */
static void misuse(const char *fmt, const char *a, const char *b) {
	report(fmt, a, b, " (--help lists the arguments)");
	exit(2);
}

/* count_arg is the value of flag, a count from 1 to INT_MAX written in
   decimal digits alone (no sign, exponent, fraction or trailing text), or
   a misuse. */
static int count_arg(const char *flag, const char *v) {
	long long n = 0;
	int digits = 0;
	for (const char *p = v; *p; p++) {
		if (*p < '0' || *p > '9') misuse("%s needs a positive whole count, not %s", flag, v);
		n = n * 10 + (*p - '0');
		digits++;
		if (n > INT_MAX) misuse("%s %s is more than this program counts", flag, v);
	}
	if (!digits || n < 1) misuse("%s needs a positive whole count, not %s", flag, v);
	return (int)n;
}

/* must_alloc allocates n zeroed bytes, or dies naming what they were for. */
static void *must_alloc(size_t n, const char *what) {
	void *p = calloc(n ? n : 1, 1);
	if (!p) die("cannot allocate memory for %s%s", what, "");
	return p;
}
#if KILN_MPI
/* The program runs as kilnrt_program.ranks MPI ranks (mpirun -np RANKS). A collective's
   group is the ranks base + i*stride, i < size, with base = rank -
   ((rank / stride) % size) * stride (the axis of a row-major mesh); each
   (size, stride) gets one communicator, split from the world at its
   first use, which every rank reaches in the same order. */
#define RANKS (kilnrt_program.ranks)
enum { MAX_GROUPS = 16 };

/* This process's MPI rank: random ops of data-parallel ranks start their
   counters from it (loops.RankIndex). */
long long kiln_world_rank;
static MPI_Comm group_comm[MAX_GROUPS];
static long long group_key[MAX_GROUPS][2];
static int ngroups;

static MPI_Comm kiln_group(long long size, long long stride) {
	for (int i = 0; i < ngroups; i++)
		if (group_key[i][0] == size && group_key[i][1] == stride) return group_comm[i];
	if (ngroups == MAX_GROUPS) die("more than %s kinds of rank groups%s", "16", "");
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	long long base = rank - ((rank / stride) % size) * stride;
	/* Only the group's members make its communicator (a pipeline's
	   stages reach their collectives at different times, so a split of
	   the whole world would wait for ranks that wait for this one). */
	int *members = must_alloc(sizeof(int) * (size_t)size, "a rank group");
	for (long long i = 0; i < size; i++) members[i] = (int)(base + i * stride);
	MPI_Group world, g;
	MPI_Comm_group(MPI_COMM_WORLD, &world);
	MPI_Group_incl(world, (int)size, members, &g);
	free(members);
	MPI_Comm_create_group(MPI_COMM_WORLD, g, 0, &group_comm[ngroups]);
	MPI_Group_free(&g);
	MPI_Group_free(&world);
	group_key[ngroups][0] = size, group_key[ngroups][1] = stride;
	return group_comm[ngroups++];
}

/* kiln_collective runs one collective of the compiled program: kind 0
   all_reduce and 1 reduce_scatter (op 0 sum, 1 max, 2 min), 2 all_gather
   along the middle of in's outer x d x inner layout, 3 broadcast from the
   group's rank root; dtype 0 f32, 1 f64, 2 i64. */
void kiln_collective(int kind, int op, void *in, void *out, long long outer, long long d, long long inner,
		long long size, long long stride, long long root, int dtype) {
	MPI_Comm comm = kiln_group(size, stride);
	MPI_Datatype t = dtype == 0 ? MPI_FLOAT : dtype == 1 ? MPI_DOUBLE : MPI_LONG_LONG;
	size_t es = dtype == 0 ? 4 : 8;
	long long n = outer * d * inner;
	if (n * size > 2147483647LL) die("a collective of more than 2^31 elements%s%s", "", "");
	char *src = in, *dst = out;
	MPI_Op mop = op == 0 ? MPI_SUM : op == 1 ? MPI_MAX : MPI_MIN;
	if (kind == 0) {
		MPI_Allreduce(src, dst, (int)n, t, mop, comm);
	} else if (kind == 1) {
		long long part = d / size, chunk = outer * part * inner;
		char *tmp = must_alloc((size_t)n * es, "a reduce_scatter");
		for (long long g = 0; g < size; g++)
			for (long long o = 0; o < outer; o++)
				memcpy(tmp + ((g * outer + o) * part * inner) * es, src + ((o * d + g * part) * inner) * es, (size_t)(part * inner) * es);
		MPI_Reduce_scatter_block(tmp, dst, (int)chunk, t, mop, comm);
		free(tmp);
	} else if (kind == 2) {
		char *tmp = must_alloc((size_t)(n * size) * es, "an all_gather");
		MPI_Allgather(src, (int)n, t, tmp, (int)n, t, comm);
		for (long long g = 0; g < size; g++)
			for (long long o = 0; o < outer; o++)
				memcpy(dst + ((o * size * d + g * d) * inner) * es, tmp + ((g * outer + o) * d * inner) * es, (size_t)(d * inner) * es);
		free(tmp);
	} else {
		memcpy(dst, src, (size_t)n * es);
		MPI_Bcast(dst, (int)n, t, (int)root, comm);
	}
}

/* kiln_send gives the n bytes at p to rank r+peer, tag tag: it copies
   them and returns at once while the copy is sent (the pipeline's order
   is checked free of deadlock on that assumption; the copies live in
   host memory until their sends have gone); kiln_recv waits for them.
   kiln_drain waits until every send of the step has gone. */
static MPI_Request *send_req;
static void **send_buf;
static int nsends, capsends;

static void kiln_drain(void) {
	if (nsends) MPI_Waitall(nsends, send_req, MPI_STATUSES_IGNORE);
	for (int i = 0; i < nsends; i++) free(send_buf[i]);
	nsends = 0;
}

static int peer_rank(long long peer, long long n) {
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank + peer < 0 || rank + peer >= RANKS) die("a send or recv names a rank outside the step's %s ranks%s", "", "");
	if (n > 2147483647LL) die("a send or recv of more than 2^31 bytes%s%s", "", "");
	return (int)(rank + peer);
}

void kiln_send(void *p, long long n, long long peer, long long tag) {
	int to = peer_rank(peer, n);
	/* Copies whose sends have gone are freed: at most the sends in
	   flight hold memory. */
	int kept = 0;
	for (int i = 0; i < nsends; i++) {
		int done = 0;
		MPI_Test(&send_req[i], &done, MPI_STATUS_IGNORE);
		if (done) {
			free(send_buf[i]);
			continue;
		}
		send_req[kept] = send_req[i], send_buf[kept] = send_buf[i];
		kept++;
	}
	nsends = kept;
	if (nsends == capsends) {
		capsends = capsends ? 2 * capsends : 16;
		send_req = realloc(send_req, sizeof *send_req * (size_t)capsends);
		send_buf = realloc(send_buf, sizeof *send_buf * (size_t)capsends);
		if (!send_req || !send_buf) die("cannot allocate the sends%s%s", "", "");
	}
	void *c = must_alloc((size_t)(n ? n : 1), "a send");
	memcpy(c, p, (size_t)n);
	MPI_Isend(c, (int)n, MPI_BYTE, to, (int)tag, MPI_COMM_WORLD, &send_req[nsends]);
	send_buf[nsends++] = c;
}

void kiln_recv(void *p, long long n, long long peer, long long tag) {
	int from = peer_rank(peer, n), got;
	MPI_Status st;
	MPI_Recv(p, (int)n, MPI_BYTE, from, (int)tag, MPI_COMM_WORLD, &st);
	MPI_Get_count(&st, MPI_BYTE, &got);
	if (got != n) die("a recv got another number of bytes than it expects%s%s", "", "");
}

/* rank_dir is DIR/rankR: each rank reads and writes its own files. */
static const char *rank_dir(const char *dir, int rank) {
	if (!dir) return NULL;
	size_t n = strlen(dir) + 32;
	char *p = must_alloc(n, "a path");
	snprintf(p, n, "%s/rank%d", dir, rank);
	return p;
}
#endif

/* wrong_shape reports a .npy file whose shape (the header's text from
   its '(') is not t's. */
static void wrong_shape(const char *path, const tensor_t *t, const char *shape) {
	char got[256], want[512];
	size_t n = strcspn(shape, ")");
	snprintf(got, sizeof got, "%.*s%s", (int)(n < 200 ? n : 200), shape, shape[n] == ')' ? ")" : "...");
	snprintf(want, sizeof want, "%s wants %s; the file's shape is %s", t->name, t->type, got);
	die("%s: %s", path, want);
}

/* check_header checks a .npy header dictionary as kiln run's reader
   (package npy) does: exactly the keys 'descr' (t's dtype),
   'fortran_order' (False) and 'shape' (t's), each once, nothing else. */
static void check_header(const char *h, const char *path, const tensor_t *t) {
	int seen_d = 0, seen_o = 0, seen_s = 0;
	const char *p = h;
	while (*p == ' ') p++;
	if (*p++ != '{') die("%s: the header is not a dict%s", path, "");
	for (;;) {
		while (*p == ' ') p++;
		if (*p == '}') break;
		if (*p != '\'') die("%s: the header has a key that is not a string%s", path, "");
		const char *k = ++p;
		while (*p && *p != '\'') p++;
		if (!*p) die("%s: the header has an unterminated key%s", path, "");
		size_t kl = (size_t)(p - k);
		p++;
		while (*p == ' ') p++;
		if (*p++ != ':') die("%s: the header wants ':' after a key%s", path, "");
		while (*p == ' ') p++;
		if (kl == 5 && strncmp(k, "descr", 5) == 0) {
			size_t dl = strlen(t->descr);
			if (seen_d++) die("%s: the header names 'descr' twice%s", path, "");
			if (p[0] != '\'' || strncmp(p + 1, t->descr, dl) != 0 || p[1 + dl] != '\'') die("%s: wrong dtype (want %s)", path, t->descr);
			p += dl + 2;
		} else if (kl == 13 && strncmp(k, "fortran_order", 13) == 0) {
			if (seen_o++) die("%s: the header names 'fortran_order' twice%s", path, "");
			if (strncmp(p, "False", 5) != 0) die("%s: Fortran order is not supported%s", path, "");
			p += 5;
		} else if (kl == 5 && strncmp(k, "shape", 5) == 0) {
			if (seen_s++) die("%s: the header names 'shape' twice%s", path, "");
			if (*p++ != '(') die("%s: no shape%s", path, "");
			const char *shape = p - 1;
			for (int i = 0; i < t->rank; i++) {
				char *end;
				while (*p == ' ') p++;
				long long v = strtoll(p, &end, 10);
				if (end == p || v != t->shape[i]) wrong_shape(path, t, shape);
				p = end;
				while (*p == ' ') p++;
				if (*p == ',') p++;
			}
			while (*p == ' ') p++;
			if (*p++ != ')') wrong_shape(path, t, shape);
		} else {
			die("%s: the header has an unknown key (only descr, fortran_order and shape)%s", path, "");
		}
		while (*p == ' ') p++;
		if (*p == ',') p++;
		else if (*p != '}') die("%s: the header wants ',' or '}' after a value%s", path, "");
	}
	for (p++; *p == ' ' || *p == '\n'; p++) {
	}
	if (*p || !seen_d || !seen_o || !seen_s) die("%s: the header lacks descr, fortran_order or shape, or has text after the dict%s", path, "");
}

/* read_npy_at reads a .npy image of t from f's position, which holds
   exactly size bytes (-1: up to the end of the file); path names it in
   errors. */
static void *read_npy_at(FILE *f, long long size, const char *path, const tensor_t *t) {
	unsigned char pre[12];
	if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) die("%s is not a .npy file%s", path, "");
	unsigned long hlen, start = 10;
	if (pre[6] == 1) {
		hlen = pre[8] | (pre[9] << 8);
	} else if (pre[6] == 2 || pre[6] == 3) {
		if (fread(pre + 10, 1, 2, f) != 2) die("%s: truncated header%s", path, "");
		hlen = pre[8] | (pre[9] << 8) | ((unsigned long)pre[10] << 16) | ((unsigned long)pre[11] << 24);
		start = 12;
	} else {
		die("%s: .npy version %s is not supported (1, 2 or 3)", path, pre[6] == 0 ? "0" : "above 3");
	}
	if (hlen > (1UL << 20)) die("%s: the header is longer than 1 MiB%s", path, "");
	char *h = must_alloc(hlen + 1, path);
	if (fread(h, 1, hlen, f) != hlen) die("%s: truncated header%s", path, "");
	h[hlen] = 0;
	if (strlen(h) != hlen) die("%s: the header holds a NUL byte%s", path, "");
	check_header(h, path, t);
	free(h);
	if (size >= 0 && (unsigned long long)size != start + hlen + (unsigned long long)t->bytes) die("%s: %s holds another number of bytes than its shape and dtype need", path, t->name);
	void *buf = must_alloc((size_t)t->bytes, t->name);
	if (fread(buf, 1, t->bytes, f) != (size_t)t->bytes) die("%s: truncated data%s", path, "");
	if (size < 0 && fgetc(f) != EOF) die("%s: bytes after the data%s", path, "");
	return buf;
}

static void *read_npy(const char *path, const tensor_t *t) {
	struct stat st;
	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) die("%s is not a regular file%s", path, "");
	FILE *f = fopen(path, "rb");
	if (!f) die("cannot open %s: %s", path, strerror(errno));
	void *buf = read_npy_at(f, -1, path, t);
	fclose(f);
	return buf;
}

static unsigned long long le(const unsigned char *b, int n) {
	unsigned long long v = 0;
	for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
	return v;
}

/* read_npz reads member NAME.npy of the zip archive path, found through
   the central directory (zip64 included), when it is stored uncompressed
   as numpy.savez writes it; NULL when there is no such member. */
static void *read_npz(const char *path, const tensor_t *t) {
	FILE *f = fopen(path, "rb");
	if (!f) die("cannot open %s: %s", path, strerror(errno));
	if (fseek(f, 0, SEEK_END) != 0) die("%s: cannot seek%s", path, "");
	long end = ftell(f);
	long tail = end < 65557 ? end : 65557; /* the end record and the longest comment */
	unsigned char *b = must_alloc((size_t)tail + 1, path);
	if (fseek(f, end - tail, SEEK_SET) != 0 || fread(b, 1, (size_t)tail, f) != (size_t)tail) die("%s: cannot read the end of the archive%s", path, "");
	long e = -1;
	for (long i = tail - 22; i >= 0; i--)
		if (le(b + i, 4) == 0x06054b50) { e = i; break; }
	if (e < 0) die("%s: not a .npz (zip) archive%s", path, "");
	unsigned long long count = le(b + e + 10, 2), cd = le(b + e + 16, 4);
	if (cd == 0xffffffffULL || count == 0xffffULL) { /* zip64: its end record holds them */
		unsigned char z[56];
		if (e < 20 || le(b + e - 20, 4) != 0x07064b50) die("%s: bad zip64 archive%s", path, "");
		if (fseek(f, (long)le(b + e - 20 + 8, 8), SEEK_SET) != 0 || fread(z, 1, 56, f) != 56 || le(z, 4) != 0x06064b50) die("%s: bad zip64 archive%s", path, "");
		count = le(z + 32, 8), cd = le(z + 48, 8);
	}
	free(b);
	char want[4200];
	snprintf(want, sizeof want, "%s.npy", t->name);
	int found = 0;
	unsigned long long found_offset = 0, found_size = 0;
	unsigned found_crc = 0;
	if (fseek(f, (long)cd, SEEK_SET) != 0) die("%s: truncated archive%s", path, "");
	for (unsigned long long k = 0; k < count; k++) {
		unsigned char h[46];
		if (fread(h, 1, 46, f) != 46 || le(h, 4) != 0x02014b50) die("%s: bad central directory%s", path, "");
		unsigned method = le(h + 10, 2), nlen = le(h + 28, 2), xlen = le(h + 30, 2), clen = le(h + 32, 2);
		unsigned long long offset = le(h + 42, 4);
		char name[65536];
		unsigned char extra[65536];
		if (fread(name, 1, nlen, f) != nlen || fread(extra, 1, xlen, f) != xlen || fseek(f, clen, SEEK_CUR) != 0) die("%s: bad central directory%s", path, "");
		name[nlen] = 0;
		if (strcmp(name, want) != 0) continue;
		if (offset == 0xffffffffULL) { /* zip64: the offset follows the sizes that overflow */
			int skip = (le(h + 24, 4) == 0xffffffffULL ? 8 : 0) + (le(h + 20, 4) == 0xffffffffULL ? 8 : 0);
			for (unsigned i = 0; i + 4 <= xlen;) {
				unsigned id = le(extra + i, 2), n = le(extra + i + 2, 2);
				if (i + 4 + n > xlen) break; /* a field running past the extra data */
				if (id == 1 && (unsigned)skip + 8 <= n) offset = le(extra + i + 4 + skip, 8);
				i += 4 + n;
			}
		}
		if (method != 0) die("%s: member %s is compressed: write the archive with numpy.savez, not savez_compressed", path, name);
		found = 1, found_offset = offset, found_crc = (unsigned)le(h + 16, 4), found_size = le(h + 20, 4);
		if (found_size == 0xffffffffULL) { /* zip64: the compressed size after the uncompressed one */
			for (unsigned i = 0; i + 4 <= xlen;) {
				unsigned id = le(extra + i, 2), n = le(extra + i + 2, 2);
				if (i + 4 + n > xlen) break;
				if (id == 1 && n >= 16) found_size = le(extra + i + 4 + 8, 8);
				i += 4 + n;
			}
		}
		/* numpy keeps the last of two members with one name: so does this */
	}
	if (found) {
		unsigned char lh[30];
		if (fseek(f, (long)found_offset, SEEK_SET) != 0 || fread(lh, 1, 30, f) != 30 || le(lh, 4) != 0x04034b50 ||
		    fseek(f, (long)(le(lh + 26, 2) + le(lh + 28, 2)), SEEK_CUR) != 0) die("%s: bad local header of %s", path, want);
		long data = ftell(f);
		/* The CRC over the member's bytes, then the image itself. */
		unsigned crc = 0xffffffffu;
		static unsigned table[256];
		for (unsigned n = 0; n < 256; n++) {
			unsigned c = n;
			for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
			table[n] = c;
		}
		unsigned char chunk[65536];
		for (unsigned long long left = found_size; left > 0;) {
			size_t n = left < sizeof chunk ? (size_t)left : sizeof chunk;
			if (fread(chunk, 1, n, f) != n) die("%s: %s is truncated", path, want);
			for (size_t i = 0; i < n; i++) crc = table[(crc ^ chunk[i]) & 0xff] ^ (crc >> 8);
			left -= n;
		}
		if (~crc != found_crc) die("%s: %s fails its CRC check", path, want);
		if (fseek(f, data, SEEK_SET) != 0) die("%s: cannot seek%s", path, "");
		void *buf = read_npy_at(f, (long long)found_size, path, t);
		fclose(f);
		return buf;
	}
	fclose(f);
	return NULL;
}

/* The .tmp file being written, which a signal that ends the program
   removes (a result is written whole under its own name, or not at all). */
static char pending_tmp[4200];
static volatile sig_atomic_t have_tmp;

static void on_signal(int sig) {
	if (have_tmp) unlink(pending_tmp);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void write_npy(const char *dir, const char *file, const tensor_t *t, const void *data) {
	char path[4096], tmp[4200];
	unsigned char header[KILN_NPY_HEADER_MAX];
	snprintf(path, sizeof path, "%s/%s.npy", dir, file);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int hl = kilnrt_npy_header(t, header);
	if (hl < 0) die("%s: the shape of %s does not fit a .npy header", path, t->name);
	have_tmp = 0;
	atomic_signal_fence(memory_order_seq_cst);
	memcpy(pending_tmp, tmp, sizeof tmp < sizeof pending_tmp ? sizeof tmp : sizeof pending_tmp);
	atomic_signal_fence(memory_order_seq_cst); /* the name is whole before the handler may read it */
	have_tmp = 1;
	FILE *f = fopen(tmp, "wb");
	if (!f) die("cannot write %s: %s", tmp, strerror(errno));
	int ok = fwrite(header, 1, (size_t)hl, f) == (size_t)hl;
	ok = fwrite(data, 1, (size_t)t->bytes, f) == (size_t)t->bytes && ok;
	ok = fclose(f) == 0 && ok;
	ok = ok && rename(tmp, path) == 0;
	have_tmp = 0;
	if (!ok) {
		int e = errno;
		unlink(tmp);
		die("cannot write %s: %s", path, strerror(e));
	}
}

/* peak_resident is VmHWM of /proc/self/status in bytes (0 if unknown). */
static long long peak_resident(void) {
	FILE *f = fopen("/proc/self/status", "r");
	if (!f) return 0;
	char line[256];
	long long kb = 0;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "VmHWM:", 6) == 0) kb = strtoll(line + 6, NULL, 10);
	fclose(f);
	return kb * 1024;
}

/* print_profile writes the kernels' times, the slowest first, to
   stderr: calls, milliseconds per run, share of the runs' time, bytes
   read and written per call and the rate they imply. */
static void print_profile(double total) {
	int n = kiln_kernels(), *order = must_alloc(sizeof(int) * (size_t)(n + 1), "the profile");
	for (int k = 0; k < n; k++) order[k] = k;
	double *secs = must_alloc(sizeof(double) * (size_t)(n + 1), "the profile");
	for (int k = 0; k < n; k++) kiln_kernel(k, NULL, NULL, NULL, NULL, &secs[k]);
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && secs[order[j]] > secs[order[j - 1]]; j--) {
			int t = order[j];
			order[j] = order[j - 1], order[j - 1] = t;
		}
	fprintf(stderr, "%-40s %8s %12s %7s %14s %10s %10s\n", "kernel", "calls", "ms per run", "share", "bytes", "GB/s", "GFLOP/s");
	for (int i = 0; i < n; i++) {
		const char *name;
		long long bytes, flops, calls;
		double s;
		kiln_kernel(order[i], &name, &bytes, &flops, &calls, &s);
		if (!calls) continue;
		double per = s / (double)calls;
		fprintf(stderr, "%-40s %8lld %12.4f %6.1f%% %14lld %10.2f %10.2f\n", name, calls, 1e3 * s / (double)calls, total > 0 ? 100 * s / total : 0,
		        bytes, per > 0 ? bytes / per / 1e9 : 0, per > 0 ? flops / per / 1e9 : 0);
	}
	free(order);
	free(secs);
}

static void usage(void) {
	printf("usage: PROGRAM [--input NAME=FILE.npy]... [--inputs DIR|FILE.npz] [--seed N] --output-dir DIR [--steps N | --repeat N] [--report-time] [--report-memory] [--profile]\n");
	printf("Runs %s. Each argument comes from --input NAME=FILE.npy, else DIR/NAME.npy of --inputs (or\n", kilnrt_program.entry);
	printf("the member NAME.npy of an .npz archive that numpy.savez wrote),\n");
	printf("else its embedded init value, else values drawn from --seed N (f64, f32, f16 and bf16 uniform in [-0.05, 0.05], others 0).\n");
	printf("Results go to DIR/NAME.npy, updated arguments to DIR/updated.NAME.npy.\n\n");
	printf("arguments:\n");
	for (int i = 0; i < NPARAMS + NINPUTS + NRESULTS; i++) {
		const tensor_t *t = &kilnrt_program.tensors[i];
		if (i == NPARAMS + NINPUTS) printf("results:\n");
		printf("  ");
		put_text(stdout, t->name);
		printf("%*s %s%s\n", 24 - (int)strlen(t->name) > 0 ? 24 - (int)strlen(t->name) : 0, "", t->type, t->kind == 0 && t->init ? "  (default: embedded init)" : "");
	}
	if (NRESULTS == 0) printf("results:\n");
}

static const char *from_dir(const char *dir, const char *file);
static const char *find_input(int argc, char **argv, const char *name);

/* check_inputs refuses an --input that names no argument, and two that
   name one. */
static void check_inputs(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		const char *spec = NULL;
		if (strcmp(argv[i], "--input") == 0 && i + 1 < argc) spec = argv[++i];
		else if (strncmp(argv[i], "--input=", 8) == 0) spec = argv[i] + 8;
		if (!spec) continue;
		const char *eq = strchr(spec, '=');
		if (!eq) misuse("--input %s is not NAME=FILE.npy%s", spec, "");
		size_t nl = (size_t)(eq - spec);
		int known = 0;
		for (int k = 0; k < NPARAMS + NINPUTS; k++) {
			const tensor_t *t = k < NPARAMS ? &params[k] : &inputs[k - NPARAMS];
			if (strlen(t->name) == nl && strncmp(t->name, spec, nl) == 0) known = 1;
		}
		if (!known) misuse("--input %s names no argument of the step", spec, "");
		for (int j = i + 1; j < argc; j++) {
			const char *other = NULL;
			if (strcmp(argv[j], "--input") == 0 && j + 1 < argc) other = argv[++j];
			else if (strncmp(argv[j], "--input=", 8) == 0) other = argv[j] + 8;
			if (other && strncmp(other, spec, nl + 1) == 0) misuse("--input gives %s twice%s", spec, "");
		}
	}
}

/* same_file reports whether paths a and b name one existing file. */
static int same_file(const char *a, const char *b) {
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* check_outputs refuses to write two results to one file, or over a file
   the arguments were read from. */
static void check_outputs(int argc, char **argv, const char *dir, const char *in_dir) {
	int n = NRESULTS + NPARAMS;
	for (int i = 0; i < n; i++) {
		const tensor_t *a = i < NRESULTS ? &results[i] : &params[i - NRESULTS];
		if (i >= NRESULTS && !a->inout) continue;
		for (int j = i + 1; j < n; j++) {
			const tensor_t *b = j < NRESULTS ? &results[j] : &params[j - NRESULTS];
			if (j >= NRESULTS && !b->inout) continue;
			if (strcmp(a->file, b->file) == 0) die("%s and %s would both be written to one file: rename one of them", a->name, b->name);
		}
		char out[4200];
		snprintf(out, sizeof out, "%s/%s.npy", dir, a->file);
		for (int k = 0; k < NPARAMS + NINPUTS; k++) {
			const tensor_t *t = k < NPARAMS ? &params[k] : &inputs[k - NPARAMS];
			const char *path = find_input(argc, argv, t->name);
			if (!path) path = from_dir(in_dir, k < NPARAMS ? t->file + 8 : t->file);
			if (path && same_file(out, path)) die("writing %s would overwrite %s, which the step read: choose another --output-dir", out, path);
		}
	}
}

/* from_dir is DIR/FILE.npy when --inputs DIR holds it, else NULL. */
static const char *from_dir(const char *dir, const char *file) {
	static char path[4096];
	struct stat st;
	if (!dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
	snprintf(path, sizeof path, "%s/%s.npy", dir, file);
	return stat(path, &st) == 0 ? path : NULL;
}

/* is_archive reports whether --inputs names a file (an .npz archive). */
static int is_archive(const char *dir) {
	struct stat st;
	return dir && stat(dir, &st) == 0 && S_ISREG(st.st_mode);
}

/* argument_value reads argument t: --input, else --inputs DIR; NULL
   when the argument keeps the embedded value kiln_create gave it. */
static void *argument_value(int argc, char **argv, const char *dir, const tensor_t *t, const char *file, const char *seed, int index);

static const char *find_input(int argc, char **argv, const char *name) {
	size_t nl = strlen(name);
	for (int i = 1; i < argc; i++) {
		const char *spec = NULL;
		if (strcmp(argv[i], "--input") == 0 && i + 1 < argc) spec = argv[++i];
		else if (strncmp(argv[i], "--input=", 8) == 0) spec = argv[i] + 8;
		if (spec && strncmp(spec, name, nl) == 0 && spec[nl] == '=') return spec + nl + 1;
	}
	return NULL;
}

/* half_bits is the IEEE half nearest f (ties to even); bfloat_bits the
   bfloat16 nearest f. For the seeded values only: they are small and
   finite. */
static uint16_t half_bits(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
	if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
	if (a < 0x38800000u) { /* subnormal: round |f|·2^24 to an integer */
		float m = (f < 0 ? -f : f) * 16777216.0f;
		uint32_t i = (uint32_t)m;
		float rest = m - (float)i;
		if (rest > 0.5f || (rest == 0.5f && (i & 1u))) i++;
		return (uint16_t)(sign | i);
	}
	uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
	return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static uint16_t bfloat_bits(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* seeded draws argument index's values from seed: floats (f64, f32, f16,
   bf16) uniform in [-0.05, 0.05] (SplitMix64 of the seed, the index and
   the element), other dtypes zero. */
static void *seeded(const tensor_t *t, long long seed, int index) {
	unsigned char *buf = must_alloc((size_t)t->bytes, t->name);
	int f32 = strcmp(t->descr, "<f4") == 0, f64 = strcmp(t->descr, "<f8") == 0, f16 = strcmp(t->descr, "<f2") == 0;
	int bf16 = strncmp(t->type, "bf16[", 5) == 0;
	long long n = t->elem_bytes > 0 ? t->bytes / t->elem_bytes : 0;
	for (long long i = 0; (f32 || f64 || f16 || bf16) && i < n; i++) {
		uint64_t z = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)index * 0xD1B54A32D192ED03ull + (uint64_t)i;
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
		z ^= z >> 31;
		double u = ((double)(z >> 11) / 9007199254740992.0 - 0.5) * 0.1;
		float v = (float)u;
		uint16_t h = f16 ? half_bits(v) : bfloat_bits(v);
		if (f64) memcpy(buf + 8 * i, &u, 8);
		else if (f32) memcpy(buf + 4 * i, &v, 4);
		else memcpy(buf + 2 * i, &h, 2);
	}
	return buf;
}

static void *argument_value(int argc, char **argv, const char *dir, const tensor_t *t, const char *file, const char *seed, int index) {
	const char *path = find_input(argc, argv, t->name);
	if (!path) path = from_dir(dir, file);
	if (path) return read_npy(path, t);
	if (is_archive(dir)) {
		void *buf = read_npz(dir, t);
		if (buf) return buf;
	}
	if (t->init) return NULL;
	if (seed) return seeded(t, atoll(seed), index);
	die("missing --input %s=FILE.npy (or --inputs DIR or .npz holding it, or --seed N)%s", t->name, "");
	return NULL;
}

int main(int argc, char **argv) {
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	const char *dir = NULL, *in_dir = NULL, *seed = NULL;
	int repeat = 1, timed = 0, report_memory = 0, report_time = 0, profile = 0, steps = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--output-dir") == 0 && i + 1 < argc) dir = argv[++i];
		else if (strncmp(argv[i], "--output-dir=", 13) == 0) dir = argv[i] + 13;
		else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = count_arg("--repeat", argv[++i]), timed = 1;
		else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = count_arg("--steps", argv[++i]);
		else if (strcmp(argv[i], "--report-memory") == 0) report_memory = 1;
		else if (strcmp(argv[i], "--report-time") == 0) report_time = 1;
		else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
			seed = argv[++i];
			char *end;
			strtoll(seed, &end, 10);
			if (!*seed || *end) misuse("--seed needs an integer, not %s%s", seed, "");
		}
		else if (strcmp(argv[i], "--profile") == 0) profile = 1;
		else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { usage(); return 0; }
		else if (strcmp(argv[i], "--inputs") == 0 && i + 1 < argc) in_dir = argv[++i];
		else if (strncmp(argv[i], "--inputs=", 9) == 0) in_dir = argv[i] + 9;
		else if (strcmp(argv[i], "--input") == 0) i++;
		else if (strncmp(argv[i], "--input=", 8) != 0) misuse("unknown argument %s%s", argv[i], "");
	}
	if (!dir) misuse("--output-dir is required%s%s", "", "");
	if (in_dir) {
		struct stat st;
		if (stat(in_dir, &st) != 0) die("--inputs %s: %s", in_dir, strerror(errno));
		if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) die("--inputs %s is neither a folder nor an .npz file%s", in_dir, "");
	}
	if (!*dir) misuse("--output-dir is empty%s%s", "", "");
	check_inputs(argc, argv);
	mkdir(dir, 0777);
#if KILN_MPI
	MPI_Init(&argc, &argv);
	int rank, world;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	kiln_world_rank = rank;
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (world != RANKS) {
		char n[32];
		snprintf(n, sizeof n, "%d", RANKS);
		die("this program runs as %s ranks (mpirun -np %s)", n, n);
	}
	dir = rank_dir(dir, rank);
	in_dir = rank_dir(in_dir, rank);
	mkdir(dir, 0777);
#endif
	/* The program is a thin caller of the runtime (kiln_runtime.h): the
	   step made once, its arguments set from the files, run, read. */
	kiln_step *s = kiln_create(kilnrt_program.threads);
	if (!s) die("cannot allocate the step%s%s", "", "");
	for (int i = 0; i < NPARAMS + NINPUTS; i++) {
		const tensor_t *t = i < NPARAMS ? &params[i] : &inputs[i - NPARAMS];
		void *v = argument_value(argc, argv, in_dir, t, i < NPARAMS ? t->file + 8 /* without "updated." */ : t->file, seed, i);
		if (v && kiln_set(s, i, v, t->bytes) != 0) die("%s%s", kiln_error(s), "");
		free(v);
	}
	if (steps && timed) misuse("--steps and --repeat exclude each other%s%s", "", "");
	if (steps) repeat = steps;
	check_outputs(argc, argv, dir, in_dir);
	void **saved = must_alloc(sizeof(void *) * ((size_t)NPARAMS + 1), "the saved arguments");
	for (int i = 0; i < NPARAMS; i++) {
		saved[i] = NULL;
		if (params[i].inout && repeat > 1 && !steps) {
			saved[i] = must_alloc((size_t)params[i].bytes, params[i].name);
			memcpy(saved[i], kiln_data(s, i), params[i].bytes);
		}
	}
	double total = 0;
	if (profile) kiln_profile(1);
	for (int r = 0; r < repeat; r++) {
		for (int i = 0; i < NPARAMS; i++)
			if (saved[i]) memcpy(kiln_data(s, i), saved[i], params[i].bytes);
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		int status = kiln_run(s);
#if KILN_MPI
		kiln_drain();
#endif
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (status != 0) die("%s%s", kiln_error(s), "");
		total += (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
	}
	if (timed || report_time) fprintf(stderr, "%d runs, %.6f seconds per run\n", repeat, total / repeat);
#if KILN_CUDA
	if (report_memory)
		fprintf(stderr, "device: %lld bytes allocated, %lld bytes measured (cudaMemGetInfo), %lld bytes planned, %lld bytes of library workspace\n",
		        kiln_cuda_memory(s, 0), kiln_cuda_memory(s, 1), kiln_cuda_memory(s, 2), kiln_cuda_memory(s, 3));
#endif
	if (report_memory) fprintf(stderr, "peak resident %lld bytes\n", peak_resident());
	if (profile) print_profile(total);
	for (int i = 0; i < NRESULTS; i++) write_npy(dir, results[i].file, &results[i], kiln_data(s, NPARAMS + NINPUTS + i));
	for (int i = 0; i < NPARAMS; i++)
		if (params[i].inout) write_npy(dir, params[i].file, &params[i], kiln_data(s, i));
	kiln_destroy(s);
#if KILN_MPI
	MPI_Finalize();
#endif
	return 0;
}
