/* The runtime of a step compiled for CUDA: the ABI of kiln_runtime.h over
   the CUDA runtime API. The same source for every step, which it knows
   through the tables of kiln_program.h (tensors, descriptor) and
   kiln_cuda_program.h (the plan's memory, results and nodes, in step.cu).

   kiln_create allocates everything once: the device arena (with the
   kernels' workspace after it), each parameter and data input (pinned
   host memory for offloaded parameters), the pinned host arena, the
   streams and events, and a host copy of every tensor. kiln_run uploads
   the arguments written since the last run on stream 0 (where the plan
   starts, so its first nodes see them), issues the plan (the first run
   issues the nodes on the streams, which initialises the modules and
   cuBLAS outside any capture; the second captures them into a CUDA
   graph, and later runs launch the graph; with KILN_CUDA_GRAPH=0 every
   run issues the nodes), waits for the device and checks kiln_status. Host copies follow the device
   lazily: kiln_data and kiln_get bring a tensor back only when the device
   changed it since, and kiln_data of an argument marks it for upload,
   since the caller may write through it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KILN_CUDA_HOST_ONLY
#if KILN_NCCL
#include <mpi.h>
#endif
#include "kiln_cuda_program.h"
#include "kiln_program.h"
#include "kiln_runtime.h"

#define tensors (kilnrt_program.tensors)
#define NTENSORS (kilnrt_program.ntensors)
#define NPARAMS (kilnrt_program.nparams)
#define NINPUTS (kilnrt_program.ninputs)
#define NARGS (NPARAMS + NINPUTS)

struct kiln_step {
	kilnrt_cuda_ctx ctx;
	void **mirror;          /* per tensor: its host copy */
	void **bound;           /* per tensor: the caller's memory a data input reads (kiln_bind) */
	unsigned char *valid;   /* per tensor: the host copy equals the device's */
	unsigned char *dirty;   /* per argument: the host copy must go to the device before the next run */
	cudaEvent_t fork, *join;
	cudaGraphExec_t graph;
	void *blas_workspace;
	int use_graph, ran;
	int *status;             /* device address of kiln_status */
	long long own, measured; /* device bytes: allocated by the runtime, and cudaMemGetInfo's difference */
	void *world;             /* the NCCL communicator of every rank, which the groups' split from */
	char err[512];
};

static int fail(kiln_step *s, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof s->err, fmt, ap);
	va_end(ap);
	return -1;
}

/* check reports a CUDA error as the step's: "what: CUDA's reason". */
static int check(kiln_step *s, cudaError_t e, const char *what) {
	if (e == cudaSuccess) return 0;
	return fail(s, "%s: %s", what, cudaGetErrorString(e));
}

const char *kiln_error(kiln_step *s) { return s ? s->err : "no step"; }
const char *kiln_descriptor(void) { return kilnrt_program.descriptor; }
int kiln_count(void) { return NTENSORS; }
long long kiln_bytes(int i) { return i >= 0 && i < NTENSORS ? tensors[i].bytes : -1; }

int kiln_find(const char *name) {
	for (int i = 0; i < NTENSORS; i++)
		if (strcmp(tensors[i].name, name) == 0) return i;
	return -1;
}

/* The profile times kernels on the CPU runtime; here kernels run
   asynchronously on the device, and the profile reports their bytes and
   FLOPs only (time them with Nsight Systems). */
void kiln_profile(int on) { (void)on; }
int kiln_kernels(void) { return kilnrt_program.nkernels; }
int kiln_kernel(int k, const char **name, long long *bytes, long long *flops, long long *calls, double *seconds) {
	if (k < 0 || k >= kilnrt_program.nkernels) return -1;
	if (name) *name = kilnrt_program.kernels[k].name;
	if (bytes) *bytes = kilnrt_program.kernels[k].bytes;
	if (flops) *flops = kilnrt_program.kernels[k].flops;
	if (calls) *calls = 0;
	if (seconds) *seconds = 0;
	return 0;
}

/* device is where tensor i lives on the device (or in pinned host
   memory: offloaded parameters, results in the host arena). */
static char *device(kiln_step *s, int i) {
	const kiln_tensor_info *t = &tensors[i];
	if (t->kind == 0) return s->ctx.params[t->slot];
	if (t->kind == 1) return s->ctx.inputs[t->slot];
	const kilnrt_cuda_place *p = &kilnrt_cuda_plan.results[t->slot];
	switch (p->space) {
	case KILNRT_PARAM: return s->ctx.params[p->slot] + p->offset;
	case KILNRT_INPUT: return s->ctx.inputs[p->slot] + p->offset;
	case KILNRT_HOST: return s->ctx.host + p->offset;
	}
	return s->ctx.arena + p->offset;
}

/* fill writes the elem bytes at value over all n bytes of dst. */
static void fill(void *dst, const void *value, long long elem, long long n) {
	char *d = (char *)dst;
	if (n <= 0 || elem <= 0) return;
	memcpy(d, value, (size_t)(elem < n ? elem : n));
	for (long long done = elem; done < n; done *= 2) memcpy(d + done, d, (size_t)(done < n - done ? done : n - done));
}

#if KILN_NCCL
/* The rank this process runs (MPI's; the driver initialised MPI). */
static int world_rank(void) {
	int rank = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	return rank;
}

/* node_rank is this process's rank among those on its node: its GPU is
   that one (mod the node's GPUs), however mpirun placed the ranks. */
static int node_rank(void) {
	MPI_Comm node;
	int rank = 0;
	if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) return world_rank();
	MPI_Comm_rank(node, &rank);
	MPI_Comm_free(&node);
	return rank;
}

/* comm_key names a communicator: kind 0 the groups of size a ranks, b
   apart; kind 1 the pair of world ranks a (sending) and b (receiving). */
typedef struct {
	long long kind, a, b;
} comm_key;

static int comm_key_cmp(const void *x, const void *y) {
	const comm_key *p = (const comm_key *)x, *q = (const comm_key *)y;
	if (p->kind != q->kind) return p->kind < q->kind ? -1 : 1;
	if (p->a != q->a) return p->a < q->a ? -1 : 1;
	if (p->b != q->b) return p->b < q->b ? -1 : 1;
	return 0;
}

/* communicators makes the NCCL communicator of the world (its id from
   rank 0, over MPI), then, split from it, one per group of the plan's
   collectives (the group of size ranks, stride apart, that holds this
   rank) and one per send or receive direction (this rank and its peer,
   the sender first). ncclCommSplit is collective over the whole world,
   and the stages of a pipeline have different plans: every rank gathers
   every rank's keys (MPI_Allgatherv) and splits once per distinct key,
   in sorted order, taking no part (NCCL_SPLIT_NOCOLOR) in the ones its
   plan does not use; each pair then moves one byte, so that NCCL has
   connected it before a capture. It copies the rank to
   kiln_device_rank. */
static int communicators(kiln_step *s) {
	const kilnrt_cuda_plan_info *plan = &kilnrt_cuda_plan;
	int rank = world_rank(), size = 0;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != plan->ranks) return fail(s, "this program runs as %d ranks (mpirun -np %d), not %d", plan->ranks, plan->ranks, size);
	ncclUniqueId id;
	memset(&id, 0, sizeof id);
	int got = rank != 0 || ncclGetUniqueId(&id) == ncclSuccess;
	MPI_Bcast(&got, 1, MPI_INT, 0, MPI_COMM_WORLD);
	if (!got) return fail(s, "NCCL could not make a communicator id");
	MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
	ncclComm_t world;
	if (ncclCommInitRank(&world, size, id, rank) != ncclSuccess) return fail(s, "NCCL could not join rank %d of %d", rank, size);
	s->world = world;
	const int mine = plan->ngroups + plan->nchannels;
	s->ctx.comms = (void **)calloc((size_t)plan->ngroups + 1, sizeof(void *));
	s->ctx.p2p = (void **)calloc((size_t)plan->nchannels + 1, sizeof(void *));
	comm_key *own = (comm_key *)calloc((size_t)mine + 1, sizeof(comm_key));
	int *counts = (int *)calloc((size_t)size, sizeof(int)), *displs = (int *)calloc((size_t)size, sizeof(int));
	if (!s->ctx.comms || !s->ctx.p2p || !own || !counts || !displs) {
		free(own), free(counts), free(displs);
		return fail(s, "out of memory");
	}
	for (int g = 0; g < plan->ngroups; g++) own[g] = (comm_key){0, plan->groups[g].size, plan->groups[g].stride};
	for (int c = 0; c < plan->nchannels; c++) {
		const long long peer = rank + plan->channels[c].peer;
		if (peer < 0 || peer >= size) {
			free(own), free(counts), free(displs);
			return fail(s, "rank %d sends to or receives from rank %lld, outside the %d ranks", rank, peer, size);
		}
		own[plan->ngroups + c] = plan->channels[c].send ? (comm_key){1, rank, peer} : (comm_key){1, peer, rank};
	}
	int n3 = 3 * mine, total = 0;
	MPI_Allgather(&n3, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
	for (int r = 0; r < size; r++) displs[r] = total, total += counts[r];
	comm_key *all = (comm_key *)calloc((size_t)total / 3 + 1, sizeof(comm_key));
	if (!all) {
		free(own), free(counts), free(displs);
		return fail(s, "out of memory");
	}
	MPI_Allgatherv(own, n3, MPI_LONG_LONG, all, counts, displs, MPI_LONG_LONG, MPI_COMM_WORLD);
	qsort(all, (size_t)total / 3, sizeof(comm_key), comm_key_cmp);
	int bad = 0;
	for (int k = 0; k < total / 3 && !bad; k++) {
		if (k > 0 && comm_key_cmp(&all[k], &all[k - 1]) == 0) continue;
		const comm_key *u = &all[k];
		int slot = -1;
		for (int j = 0; j < mine; j++)
			if (comm_key_cmp(&own[j], u) == 0) slot = j;
		int color = NCCL_SPLIT_NOCOLOR, key = 0;
		if (slot >= 0 && u->kind == 0) {
			const long long n = u->a, stride = u->b;
			color = (int)((rank / (n * stride)) * stride + rank % stride), key = (int)((rank / stride) % n);
		} else if (slot >= 0) {
			color = 0, key = rank == u->a ? 0 : 1;
		}
		ncclComm_t c = NULL;
		if (ncclCommSplit(world, color, key, &c, NULL) != ncclSuccess) {
			bad = fail(s, u->kind == 0 ? "NCCL could not make the group of %lld ranks %lld apart" : "NCCL could not join ranks %lld and %lld", u->a, u->b);
			break;
		}
		if (slot < 0) continue;
		if (slot < plan->ngroups) {
			s->ctx.comms[slot] = c;
			continue;
		}
		s->ctx.p2p[slot - plan->ngroups] = c;
		/* NCCL connects the pair on its first send and receive, a host
		   handshake with the peer: done here, in key order on both, and
		   not during a capture, where two ranks that first used two
		   pairs in opposite orders would wait for each other. One byte
		   of the arena, which holds nothing before the first step. */
		ncclResult_t e = rank == u->a ? ncclSend(s->ctx.arena, 1, ncclUint8, 1, c, s->ctx.streams[0]) : ncclRecv(s->ctx.arena, 1, ncclUint8, 0, c, s->ctx.streams[0]);
		if (e != ncclSuccess || cudaStreamSynchronize(s->ctx.streams[0]) != cudaSuccess)
			bad = fail(s, "NCCL could not connect ranks %lld and %lld", u->a, u->b);
	}
	free(all), free(own), free(counts), free(displs);
	if (bad) return bad;
	long long r = rank, *at = kilnrt_cuda_rank_address();
	if (!at || cudaMemcpy(at, &r, sizeof r, cudaMemcpyHostToDevice) != cudaSuccess) return fail(s, "cannot set the device's rank");
	return 0;
}
#endif

void kiln_destroy(kiln_step *s) {
	if (!s) return;
	cudaDeviceSynchronize();
	if (s->graph) cudaGraphExecDestroy(s->graph); /* before the communicators its NCCL nodes use */
#if KILN_NCCL
	for (int g = 0; s->ctx.comms && g < kilnrt_cuda_plan.ngroups; g++)
		if (s->ctx.comms[g]) ncclCommDestroy((ncclComm_t)s->ctx.comms[g]);
	for (int c = 0; s->ctx.p2p && c < kilnrt_cuda_plan.nchannels; c++)
		if (s->ctx.p2p[c]) ncclCommDestroy((ncclComm_t)s->ctx.p2p[c]);
	free(s->ctx.p2p);
	if (s->world) ncclCommDestroy((ncclComm_t)s->world);
	free(s->ctx.comms);
#endif
	if (s->ctx.blas) cublasDestroy(s->ctx.blas);
	if (s->ctx.lt) cublasLtDestroy(s->ctx.lt);
	if (s->blas_workspace) cudaFree(s->blas_workspace);
	for (int i = 0; s->ctx.params && i < NPARAMS; i++) {
		if (!s->ctx.params[i]) continue;
		if (kilnrt_cuda_plan.param_host[i]) cudaFreeHost(s->ctx.params[i]);
		else cudaFree(s->ctx.params[i]);
	}
	for (int i = 0; s->ctx.inputs && i < NINPUTS; i++)
		if (s->ctx.inputs[i]) cudaFree(s->ctx.inputs[i]);
	if (s->ctx.arena) cudaFree(s->ctx.arena);
	if (s->ctx.host) cudaFreeHost(s->ctx.host);
	for (int i = 0; s->ctx.streams && i < kilnrt_cuda_plan.nstreams; i++)
		if (s->ctx.streams[i]) cudaStreamDestroy(s->ctx.streams[i]);
	for (int i = 0; s->ctx.events && i < kilnrt_cuda_plan.nevents; i++)
		if (s->ctx.events[i]) cudaEventDestroy(s->ctx.events[i]);
	for (int i = 0; s->join && i < kilnrt_cuda_plan.nstreams; i++)
		if (s->join[i]) cudaEventDestroy(s->join[i]);
	if (s->fork) cudaEventDestroy(s->fork);
	for (int i = 0; s->mirror && i < NTENSORS; i++) free(s->mirror[i]);
	free(s->mirror), free(s->bound), free(s->valid), free(s->dirty), free(s->join);
	free(s->ctx.params), free(s->ctx.inputs), free(s->ctx.streams), free(s->ctx.events);
	free(s);
}

/* pointer_alignment is the largest power of two up to 256 that divides
   p's address. */
static unsigned int pointer_alignment(const void *p) {
	unsigned long long a = (unsigned long long)(size_t)p;
	unsigned int align = 1;
	while (align < 256 && a % (2ull * align) == 0) align *= 2;
	return align;
}

int kilnrt_cuda_lt_bias(const kilnrt_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, cudaDataType at,
                        int lda, const void *B, cudaDataType bt, int ldb, float *C, int ldc, const float *bias) {
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
	cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
	cudaDataType bias_type = CUDA_R_32F;
	const float one = 1.0f, zero = 0.0f;
	int bad = !c->lt || cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS;
	bad = bad || cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type) != CUBLAS_STATUS_SUCCESS;
	/* The layouts are of the matrices as stored: op(X) transposes. */
	bad = bad || cublasLtMatrixLayoutCreate(&la, at, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda) != CUBLAS_STATUS_SUCCESS;
	bad = bad || cublasLtMatrixLayoutCreate(&lb, bt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb) != CUBLAS_STATUS_SUCCESS;
	bad = bad || cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc) != CUBLAS_STATUS_SUCCESS;
	/* The algorithm for these pointers' alignments (the heuristic assumes
	   256 bytes unless told) and the workspace there is. */
	cublasLtMatmulPreference_t pref = NULL;
	unsigned long long workspace = (unsigned long long)c->blas_workspace_bytes;
	unsigned int align_a = pointer_alignment(A), align_b = pointer_alignment(B), align_c = pointer_alignment(C);
	cublasLtMatmulHeuristicResult_t heuristic;
	int found = 0;
	bad = bad || cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c) != CUBLAS_STATUS_SUCCESS ||
	      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c) != CUBLAS_STATUS_SUCCESS;
	bad = bad || cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, lc, lc, pref, 1, &heuristic, &found) != CUBLAS_STATUS_SUCCESS || found < 1;
	bad = bad || cublasLtMatmul(c->lt, op, &one, A, la, B, lb, &zero, C, lc, C, lc, &heuristic.algo, c->blas_workspace, (size_t)c->blas_workspace_bytes,
	                            c->streams[0]) != CUBLAS_STATUS_SUCCESS;
	/* cuBLASLt reads the descriptors when the call is issued. */
	if (pref) cublasLtMatmulPreferenceDestroy(pref);
	if (lc) cublasLtMatrixLayoutDestroy(lc);
	if (lb) cublasLtMatrixLayoutDestroy(lb);
	if (la) cublasLtMatrixLayoutDestroy(la);
	if (op) cublasLtMatmulDescDestroy(op);
	return bad;
}

/* device_alloc allocates n bytes (at least one) of device memory, or of
   pinned host memory, and counts the device bytes asked for (n). */
static void *device_alloc(kiln_step *s, long long n, int host) {
	void *p = NULL;
	size_t size = (size_t)(n > 0 ? n : 1);
	if (host) return cudaHostAlloc(&p, size, cudaHostAllocDefault) == cudaSuccess ? p : NULL;
	if (cudaMalloc(&p, size) != cudaSuccess) return NULL;
	s->own += n > 0 ? n : 0;
	return p;
}

kiln_step *kiln_create(int threads) {
	(void)threads;
	const kilnrt_cuda_plan_info *plan = &kilnrt_cuda_plan;
	size_t free0 = 0, free1 = 0, total = 0;
#if KILN_NCCL
	/* A GPU per rank, before anything makes a context. */
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1 || cudaSetDevice(node_rank() % devices) != cudaSuccess) {
		fprintf(stderr, "kiln: rank %d finds no GPU to run on\n", world_rank());
		return NULL;
	}
#endif
	/* The first call makes the CUDA context, so free0 is measured after it. */
	if (cudaMemGetInfo(&free0, &total) != cudaSuccess) return NULL;
	long long need = plan->arena_bytes + (plan->nlibrary ? plan->blas_workspace_bytes : 0);
	for (int i = 0; i < NARGS; i++)
		if (!(tensors[i].kind == 0 && plan->param_host[tensors[i].slot])) need += tensors[i].bytes;
	if ((unsigned long long)need > (unsigned long long)free0) return NULL;
	kiln_step *s = (kiln_step *)calloc(1, sizeof *s);
	if (!s) return NULL;
	s->ctx.params = (char **)calloc((size_t)NPARAMS + 1, sizeof(char *));
	s->ctx.inputs = (char **)calloc((size_t)NINPUTS + 1, sizeof(char *));
	s->ctx.streams = (cudaStream_t *)calloc((size_t)plan->nstreams + 1, sizeof(cudaStream_t));
	s->ctx.events = (cudaEvent_t *)calloc((size_t)plan->nevents + 1, sizeof(cudaEvent_t));
	s->join = (cudaEvent_t *)calloc((size_t)plan->nstreams + 1, sizeof(cudaEvent_t));
	s->mirror = (void **)calloc((size_t)NTENSORS + 1, sizeof(void *));
	s->bound = (void **)calloc((size_t)NTENSORS + 1, sizeof(void *));
	s->valid = (unsigned char *)calloc((size_t)NTENSORS + 1, 1);
	s->dirty = (unsigned char *)calloc((size_t)NTENSORS + 1, 1);
	int ok = s->ctx.params && s->ctx.inputs && s->ctx.streams && s->ctx.events && s->join && s->mirror && s->bound && s->valid && s->dirty;
	for (int i = 0; ok && i < plan->nstreams; i++)
		ok = cudaStreamCreateWithFlags(&s->ctx.streams[i], cudaStreamNonBlocking) == cudaSuccess &&
		     cudaEventCreateWithFlags(&s->join[i], cudaEventDisableTiming) == cudaSuccess;
	for (int i = 0; ok && i < plan->nevents; i++) ok = cudaEventCreateWithFlags(&s->ctx.events[i], cudaEventDisableTiming) == cudaSuccess;
	ok = ok && cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming) == cudaSuccess;
	ok = ok && (s->ctx.arena = (char *)device_alloc(s, plan->arena_bytes, 0)) != NULL;
	ok = ok && (s->ctx.host = (char *)device_alloc(s, plan->host_bytes, 1)) != NULL;
	if (ok && plan->nlibrary) {
		/* cuBLAS on stream 0 with a workspace of its own, so that a
		   captured step allocates nothing. */
		ok = (s->blas_workspace = device_alloc(s, plan->blas_workspace_bytes, 0)) != NULL && cublasCreate(&s->ctx.blas) == CUBLAS_STATUS_SUCCESS &&
		     cublasSetStream(s->ctx.blas, s->ctx.streams[0]) == CUBLAS_STATUS_SUCCESS &&
		     cublasSetWorkspace(s->ctx.blas, s->blas_workspace, (size_t)plan->blas_workspace_bytes) == CUBLAS_STATUS_SUCCESS &&
		     cublasLtCreate(&s->ctx.lt) == CUBLAS_STATUS_SUCCESS;
		s->ctx.blas_workspace = s->blas_workspace;
		s->ctx.blas_workspace_bytes = plan->blas_workspace_bytes;
	}
	for (int i = 0; ok && i < NTENSORS; i++) {
		const kiln_tensor_info *t = &tensors[i];
		ok = (s->mirror[i] = calloc((size_t)(t->bytes > 0 ? t->bytes : 1), 1)) != NULL;
		if (ok && t->kind == 0) ok = (s->ctx.params[t->slot] = (char *)device_alloc(s, t->bytes, plan->param_host[t->slot])) != NULL;
		if (ok && t->kind == 1) ok = (s->ctx.inputs[t->slot] = (char *)device_alloc(s, t->bytes, 0)) != NULL;
		if (!ok || t->kind == 2) continue;
		/* The embedded value, zero where none. */
		if (t->init && t->splat) fill(s->mirror[i], t->init, t->elem_bytes, t->bytes);
		else if (t->init) memcpy(s->mirror[i], t->init, (size_t)t->bytes);
		ok = cudaMemcpy(device(s, i), s->mirror[i], (size_t)t->bytes, cudaMemcpyDefault) == cudaSuccess;
		s->valid[i] = 1;
	}
#if KILN_NCCL
	ok = ok && communicators(s) == 0;
#endif
	int *status = ok ? kilnrt_cuda_status_address() : NULL;
	ok = ok && status && cudaMemset(status, 0, sizeof(int)) == cudaSuccess;
	ok = ok && cudaDeviceSynchronize() == cudaSuccess && cudaMemGetInfo(&free1, &total) == cudaSuccess;
	if (!ok) {
		if (s->err[0]) fprintf(stderr, "kiln: %s\n", s->err); /* kiln_create has no step to say it with */
		kiln_destroy(s);
		return NULL;
	}
	s->status = status;
	s->measured = (long long)free0 - (long long)free1;
	const char *g = getenv("KILN_CUDA_GRAPH");
	s->use_graph = !(g && strcmp(g, "0") == 0);
	return s;
}

/* kiln_cuda_memory reports device bytes: which 0, what the runtime
   allocated; 1, the fall in cudaMemGetInfo's free memory over
   kiln_create (the CUDA context excluded); 2, what the plan says the
   step needs (the arena with its workspace, the parameters and inputs
   on the device); 3, the workspace the runtime gives cuBLAS. */
extern "C" long long kiln_cuda_memory(kiln_step *s, int which) {
	if (which == 0) return s->own;
	if (which == 1) return s->measured;
	if (which == 3) return kilnrt_cuda_plan.nlibrary ? kilnrt_cuda_plan.blas_workspace_bytes : 0;
	long long n = kilnrt_cuda_plan.arena_bytes;
	for (int i = 0; i < NARGS; i++)
		if (!(tensors[i].kind == 0 && kilnrt_cuda_plan.param_host[tensors[i].slot])) n += tensors[i].bytes;
	return n;
}

/* capture records the plan into a CUDA graph: every other stream joins
   stream 0's capture through the fork event and rejoins it at the end.
   It returns 0 when the graph is ready, 1 when CUDA could not capture the
   step (its nodes are then issued each run), -1 on a refused call. */
static int capture(kiln_step *s) {
	const kilnrt_cuda_plan_info *plan = &kilnrt_cuda_plan;
	cudaStream_t s0 = s->ctx.streams[0];
	if (check(s, cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal), "capturing the step") != 0) return -1;
	cudaEventRecord(s->fork, s0);
	for (int i = 1; i < plan->nstreams; i++) cudaStreamWaitEvent(s->ctx.streams[i], s->fork, 0);
	int refused = kilnrt_cuda_issue(&s->ctx);
	for (int i = 1; i < plan->nstreams; i++) {
		cudaEventRecord(s->join[i], s->ctx.streams[i]);
		cudaStreamWaitEvent(s0, s->join[i], 0);
	}
	cudaGraph_t g = NULL;
	cudaError_t e = cudaStreamEndCapture(s0, &g);
	if (e == cudaSuccess && refused) {
		cudaGraphDestroy(g);
		return fail(s, "cuBLAS, NCCL or a cooperative launch refused a call of the step (status %d)", refused);
	}
	if (e == cudaSuccess) {
		e = cudaGraphInstantiateWithFlags(&s->graph, g, 0);
		cudaGraphDestroy(g);
		if (e == cudaSuccess) return 0;
		s->graph = NULL;
	} else if (g) {
		cudaGraphDestroy(g);
	}
	/* A CUDA that cannot capture some node (a cooperative launch, on
	   older drivers) still runs the step: its nodes are issued each run,
	   as with KILN_CUDA_GRAPH=0. */
	cudaGetLastError();
	fprintf(stderr, "kiln: the step could not be captured into a CUDA graph (%s); its nodes are issued each run\n", cudaGetErrorString(e));
	s->use_graph = 0;
	return 1;
}

int kiln_run(kiln_step *s) {
	/* On stream 0, before the plan's first node: the stream orders them
	   (a copy on the legacy stream would not, to a non-blocking stream). */
	for (int i = 0; i < NARGS; i++) {
		const void *src = s->bound[i] ? s->bound[i] : s->dirty[i] ? s->mirror[i] : NULL;
		if (src && check(s, cudaMemcpyAsync(device(s, i), src, (size_t)tensors[i].bytes, cudaMemcpyDefault, s->ctx.streams[0]), tensors[i].name) != 0)
			return -1;
		s->dirty[i] = 0;
	}
	int captured = 0;
	if (s->use_graph && s->ran) {
		const int c = s->graph ? 0 : capture(s);
		if (c < 0) return -1;
		captured = c == 0;
	}
	if (captured) {
		if (check(s, cudaGraphLaunch(s->graph, s->ctx.streams[0]), "launching the step") != 0) return -1;
	} else if (kilnrt_cuda_issue(&s->ctx) != 0) {
		cudaDeviceSynchronize();
		return fail(s, "cuBLAS, NCCL or a cooperative launch refused a call of the step");
	}
	if (check(s, cudaDeviceSynchronize(), "running the step") != 0 || check(s, cudaGetLastError(), "running the step") != 0) return -1;
	s->ran = 1;
	for (int i = 0; i < NTENSORS; i++)
		if (tensors[i].kind == 2 || (tensors[i].kind == 0 && tensors[i].inout)) s->valid[i] = 0;
	int status = 0;
	if (check(s, cudaMemcpy(&status, s->status, sizeof status, cudaMemcpyDeviceToHost), "reading the step's status") != 0) return -1;
	if (status != 0) {
		if (check(s, cudaMemsetAsync(s->status, 0, sizeof(int), s->ctx.streams[0]), "resetting the step's status") != 0) return -1;
		return fail(s, "index out of range: a gather index or a cross-entropy label lies outside its dimension");
	}
	return 0;
}

/* host brings tensor i's host copy up to date; NULL when it cannot. */
static void *host(kiln_step *s, int i) {
	if (!s->valid[i]) {
		if (cudaMemcpy(s->mirror[i], device(s, i), (size_t)tensors[i].bytes, cudaMemcpyDefault) != cudaSuccess) return NULL;
		s->valid[i] = 1;
	}
	return s->mirror[i];
}

void *kiln_data(kiln_step *s, int i) {
	if (i < 0 || i >= NTENSORS) return NULL;
	if (tensors[i].kind == 2 && !s->ran) return NULL;
	if (s->bound[i]) return s->bound[i];
	void *p = host(s, i);
	if (p && i < NARGS) s->dirty[i] = 1; /* the caller may write through it */
	return p;
}

int kiln_set(kiln_step *s, int i, const void *src, long long bytes) {
	if (i < 0 || i >= NARGS) return fail(s, "tensor %d is not an argument", i);
	if (bytes != tensors[i].bytes) return fail(s, "%s holds %lld bytes, not %lld", tensors[i].name, tensors[i].bytes, bytes);
	memcpy(s->mirror[i], src, (size_t)bytes);
	s->valid[i] = s->dirty[i] = 1;
	s->bound[i] = NULL;
	return 0;
}

int kiln_get(kiln_step *s, int i, void *dst, long long bytes) {
	if (i < 0 || i >= NTENSORS) return fail(s, "no tensor %d", i);
	if (bytes != tensors[i].bytes) return fail(s, "%s holds %lld bytes, not %lld", tensors[i].name, tensors[i].bytes, bytes);
	if (tensors[i].kind == 2 && !s->ran) return fail(s, "result %s is not made before the first run", tensors[i].name);
	const void *p = s->bound[i] ? s->bound[i] : host(s, i);
	if (!p) return fail(s, "cannot copy %s from the device", tensors[i].name);
	memcpy(dst, p, (size_t)bytes);
	return 0;
}

int kiln_bind(kiln_step *s, int i, void *data) {
	if (i < 0 || i >= NTENSORS || tensors[i].kind != 1) return fail(s, "tensor %d is not a data input", i);
	s->bound[i] = data;
	/* The device copy held the bound memory's bytes: the own buffer goes up again. */
	if (!data) s->dirty[i] = 1;
	return 0;
}

/* params gathers the parameter slots' host copies, brought up to date. */
static void **params(kiln_step *s) {
	void **pv = (void **)calloc((size_t)NPARAMS + 1, sizeof(void *));
	for (int i = 0; pv && i < NARGS; i++)
		if (tensors[i].kind == 0 && !(pv[tensors[i].slot] = host(s, i))) {
			free(pv);
			return NULL;
		}
	return pv;
}

int kiln_save(kiln_step *s, const char *path) {
	void **pv = params(s);
	if (!pv) return fail(s, "cannot copy the parameters from the device");
	int rc = kilnrt_save(pv, path, s->err, sizeof s->err);
	free(pv);
	return rc;
}

int kiln_load(kiln_step *s, const char *path) {
	void **pv = params(s);
	if (!pv) return fail(s, "cannot copy the parameters from the device");
	int rc = kilnrt_load(pv, path, s->err, sizeof s->err);
	free(pv);
	if (rc == 0)
		for (int i = 0; i < NARGS; i++)
			if (tensors[i].kind == 0) s->dirty[i] = 1;
	return rc;
}
