/* Checkpoints of a compiled step: every parameter and state tensor as a
   member NAME.npy of an uncompressed zip (.npz) archive, as numpy.savez
   writes it. The same source serves the CPU runtime (runtime.c) and the
   CUDA runtime (kiln_cuda_runtime.cu, which passes host copies of the
   device tensors), so it is valid C and C++. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln_program.h"

#define tensors (kilnrt_program.tensors)
#define NPARAMS (kilnrt_program.nparams)

static int ckfail(char *err, size_t errlen, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
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

int kilnrt_save(void *const *pv, const char *path, char *err, size_t errlen) {
	pthread_once(&crc_once, crc_init);
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return ckfail(err, errlen, "path too long");
	FILE *f = fopen(tmp, "wb");
	if (!f) return ckfail(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
	/* Every member carries zip64 sizes and offsets (numpy reads them), so
	   that no size needs a second layout. */
	unsigned long long *offsets = (unsigned long long *)calloc((size_t)NPARAMS + 1, sizeof *offsets), *sizes = (unsigned long long *)calloc((size_t)NPARAMS + 1, sizeof *sizes);
	unsigned *crcs = (unsigned *)calloc((size_t)NPARAMS + 1, sizeof *crcs);
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
		const void *data = pv[t->slot];
		unsigned crc = crc32(crc32(0, h, (size_t)hl), (const unsigned char *)data, (size_t)t->bytes);
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
	/* On disk before it takes the checkpoint's name. */
	ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
	if (fclose(f) != 0 || !ok) {
		remove(tmp);
		return ckfail(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
	}
	if (rename(tmp, path) != 0) {
		remove(tmp);
		return ckfail(err, errlen, "cannot write %s: %s", path, strerror(errno));
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
static int load_member(char *err, size_t errlen, const kiln_tensor_info *t, const unsigned char *b, unsigned long long n, void *dst) {
	if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0 || (b[6] != 1 && b[6] != 2)) return ckfail(err, errlen, "%s.npy is not a .npy image", t->name);
	unsigned long long hl = b[6] == 1 ? get(b + 8, 2) : get(b + 8, 4), start = b[6] == 1 ? 10 : 12;
	if (start + hl > n) return ckfail(err, errlen, "%s.npy: truncated header", t->name);
	char h[4096];
	if (hl >= sizeof h) return ckfail(err, errlen, "%s.npy: header too long", t->name);
	memcpy(h, b + start, (size_t)hl);
	h[hl] = 0;
	const char *d = header_value(h, "'descr'"), *o = header_value(h, "'fortran_order'"), *sh = header_value(h, "'shape'");
	size_t dl = strlen(t->descr);
	if (!d || d[0] != '\'' || strncmp(d + 1, t->descr, dl) != 0 || d[1 + dl] != '\'') return ckfail(err, errlen, "%s.npy: wrong dtype (want %s)", t->name, t->descr);
	if (!o || strncmp(o, "False", 5) != 0) return ckfail(err, errlen, "%s.npy: Fortran order is not supported", t->name);
	if (!sh || *sh != '(') return ckfail(err, errlen, "%s.npy: no shape", t->name);
	const char *lp = sh++;
	int same = 1;
	for (int i = 0; i < t->rank && same; i++) {
		char *e;
		long long v = strtoll(sh, &e, 10);
		if (e == sh || v != t->shape[i]) same = 0;
		for (sh = e; *sh == ',' || *sh == ' '; sh++) {
		}
	}
	if (!same || *sh != ')') {
		/* Both shapes, as numpy writes them: the file's up to its ')'. */
		const char *rp = strchr(lp, ')');
		int found = rp ? (int)(rp - lp + 1) : (int)strlen(lp);
		char want[640];
		size_t at = 0;
		want[0] = 0;
		for (int i = 0; i < t->rank && at < sizeof want; i++) {
			int w = snprintf(want + at, sizeof want - at, i ? ", %lld" : "%lld", t->shape[i]);
			if (w < 0) break;
			at += (size_t)w;
		}
		return ckfail(err, errlen, "%s.npy: shape %.*s, the step holds (%s%s)", t->name, found > 200 ? 200 : found, lp, want, t->rank == 1 ? "," : "");
	}
	if (n - start - hl != (unsigned long long)t->bytes) return ckfail(err, errlen, "%s.npy: %llu data bytes, want %lld", t->name, n - start - hl, t->bytes);
	memcpy(dst, b + start + hl, (size_t)t->bytes);
	return 0;
}

/* fits reports whether n bytes from offset at lie within size bytes,
   without overflow (offsets come from the file). */
static int fits(unsigned long long at, unsigned long long n, long size) {
	return size >= 0 && at <= (unsigned long long)size && n <= (unsigned long long)size - at;
}

int kilnrt_load(void *const *pv, const char *path, char *err, size_t errlen) {
	/* A regular file only: opened without blocking (a FIFO would wait for
	   a writer) and checked before anything is read. */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) return ckfail(err, errlen, "cannot open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return ckfail(err, errlen, "%s is not a regular file", path);
	}
	FILE *f = fdopen(fd, "rb");
	if (!f) {
		close(fd);
		return ckfail(err, errlen, "cannot open %s: %s", path, strerror(errno));
	}
	unsigned char *all = NULL;
	long size = -1;
	if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
	if (size > 0 && fseek(f, 0, SEEK_SET) == 0 && (all = (unsigned char *)malloc((size_t)size)) && fread(all, 1, (size_t)size, f) != (size_t)size) {
		free(all);
		all = NULL;
	}
	fclose(f);
	if (!all) return ckfail(err, errlen, "cannot read %s", path);
	int rc = 0;
	void **staged = (void **)calloc((size_t)NPARAMS + 1, sizeof *staged);
	if (!staged) {
		free(all);
		return ckfail(err, errlen, "out of memory");
	}
	/* The end record, then the central directory (zip64 where marked). */
	long e = -1;
	for (long i = size - 22; i >= 0 && i >= size - 65557; i--)
		if (get(all + i, 4) == 0x06054b50) { e = i; break; }
	unsigned long long count = 0, cd = 0;
	if (e < 0) rc = ckfail(err, errlen, "%s is not an .npz (zip) archive", path);
	else {
		count = get(all + e + 10, 2), cd = get(all + e + 16, 4);
		if (count == 0xffff || cd == 0xffffffffu) {
			unsigned long long z;
			if (e < 20 || get(all + e - 20, 4) != 0x07064b50 || !fits(z = get(all + e - 12, 8), 56, size) || get(all + z, 4) != 0x06064b50)
				rc = ckfail(err, errlen, "%s: bad zip64 archive", path);
			else count = get(all + z + 32, 8), cd = get(all + z + 48, 8);
		}
	}
	unsigned long long p = cd;
	for (unsigned long long k = 0; rc == 0 && k < count; k++) {
		if (!fits(p, 46, size) || get(all + p, 4) != 0x02014b50) { rc = ckfail(err, errlen, "%s: bad central directory", path); break; }
		unsigned method = (unsigned)get(all + p + 10, 2), nl = (unsigned)get(all + p + 28, 2), xl = (unsigned)get(all + p + 30, 2), cl = (unsigned)get(all + p + 32, 2);
		unsigned long long csize = get(all + p + 20, 4), off = get(all + p + 42, 4), usize = get(all + p + 24, 4);
		unsigned crc = (unsigned)get(all + p + 16, 4);
		if (!fits(p, 46ULL + nl + xl + cl, size)) { rc = ckfail(err, errlen, "%s: bad central directory", path); break; }
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
		if (method != 0 || csize != usize) { rc = ckfail(err, errlen, "%s: member %s.npy is compressed (write it with numpy.savez)", path, tensors[ti].name); break; }
		if (!fits(off, 30, size) || get(all + off, 4) != 0x04034b50) { rc = ckfail(err, errlen, "%s: bad local header of %s.npy", path, tensors[ti].name); break; }
		unsigned long long data = off + 30 + get(all + off + 26, 2) + get(all + off + 28, 2);
		if (!fits(data, csize, size)) { rc = ckfail(err, errlen, "%s: %s.npy is truncated", path, tensors[ti].name); break; }
		pthread_once(&crc_once, crc_init);
		if (crc32(0, all + data, (size_t)csize) != crc) { rc = ckfail(err, errlen, "%s: %s.npy fails its CRC check", path, tensors[ti].name); break; }
		free(staged[ti]); /* numpy keeps the last of two members with one name */
		staged[ti] = malloc((size_t)(tensors[ti].bytes ? tensors[ti].bytes : 1));
		if (!staged[ti]) { rc = ckfail(err, errlen, "out of memory"); break; }
		rc = load_member(err, errlen, &tensors[ti], all + data, csize, staged[ti]);
	}
	for (int i = 0; rc == 0 && i < NPARAMS; i++)
		if (!staged[i]) rc = ckfail(err, errlen, "%s has no member %s.npy", path, tensors[i].name);
	for (int i = 0; i < NPARAMS; i++) {
		if (rc == 0) memcpy(pv[tensors[i].slot], staged[i], (size_t)tensors[i].bytes);
		free(staged[i]);
	}
	free(staged);
	free(all);
	return rc;
}
