/* kiln_cuda_program.h: what a CUDA step's generated step.cu tells the
   fixed CUDA runtime (kiln_cuda_runtime.cu), beside the tables of
   kiln_program.h that the CPU runtime reads too. Internal to one build;
   kiln_runtime.h is the ABI. */
#ifndef KILN_CUDA_PROGRAM_H
#define KILN_CUDA_PROGRAM_H

#include "kiln_cuda.h"

/* Where a tensor lives: space 0 the device arena, 1 a parameter slot, 2
   a data input slot, 3 the pinned host arena; offset bytes into it. */
enum { KILNRT_ARENA = 0, KILNRT_PARAM = 1, KILNRT_INPUT = 2, KILNRT_HOST = 3 };
typedef struct {
	int space, slot;
	long long offset;
} kilnrt_cuda_place;

/* The memory and streams one step issues its nodes on. */
typedef struct {
	char *arena;   /* device: the arena, then the kernels' workspace */
	char **params; /* per parameter slot: device memory, or pinned host memory where param_host says */
	char **inputs; /* per data input slot: device memory */
	char *host;    /* pinned host arena of swapped-out tensors */
	cudaStream_t *streams;
	cudaEvent_t *events;
	cublasHandle_t blas; /* on stream 0, with its own workspace; NULL when the plan calls no library */
	cublasLtHandle_t lt; /* cuBLASLt, for GEMMs with an epilogue: stream 0 and blas's workspace, which it uses in stream order */
	void *blas_workspace;
	long long blas_workspace_bytes;
	void **comms;        /* per group of the plan: its ncclComm_t (a program of several ranks) */
	void **p2p;          /* per channel of the plan: the ncclComm_t of this rank and its peer, the sender rank 0 */
} kilnrt_cuda_ctx;

/* A group of ranks a collective runs over: size ranks, stride apart,
   holding this rank. */
typedef struct {
	long long size, stride;
} kilnrt_cuda_group;

/* A direction a pipeline stage's sends (send 1) or receives (send 0) go:
   to or from world rank r+peer. */
typedef struct {
	long long peer;
	int send;
} kilnrt_cuda_channel;

typedef struct {
	long long arena_bytes; /* the arena and the workspace after it */
	long long workspace_bytes;
	long long host_bytes;
	long long blas_workspace_bytes; /* the device memory cuBLAS gets (cublasSetWorkspace) */
	int nstreams, nevents, nnodes, nlaunches, nlibrary;
	const int *param_host;            /* per parameter slot: 1 when it lives in pinned host memory (offloaded) */
	const kilnrt_cuda_place *results; /* per result */
	int ranks, ngroups;               /* the world's ranks (every pipeline stage's), and the plan's groups */
	const kilnrt_cuda_group *groups;
	int nchannels; /* a pipeline stage's send and receive directions */
	const kilnrt_cuda_channel *channels;
} kilnrt_cuda_plan_info;

extern const kilnrt_cuda_plan_info kilnrt_cuda_plan;

/* kilnrt_cuda_issue issues every node of the plan, in order, on c's
   streams: launches, library calls, copies, host functions, event
   records and waits. It returns 0, or nonzero when a library call or a
   cooperative launch refused (other launches' errors show in
   cudaGetLastError). */
int kilnrt_cuda_issue(const kilnrt_cuda_ctx *c);

/* kilnrt_cuda_lt_bias issues on stream 0 with cuBLASLt C = op(A)·op(B)
   + bias (bias[i] added to row i; CUBLASLT_EPILOGUE_BIAS), C an m × n
   f32 matrix column-major with leading dimension ldc, op(X) as
   cublasGemmEx takes it, f32 accumulation: 0, or nonzero when cuBLASLt
   refused. */
int kilnrt_cuda_lt_bias(const kilnrt_cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, cudaDataType at,
                        int lda, const void *B, cudaDataType bt, int ldb, float *C, int ldc, const float *bias);

/* kilnrt_cuda_status_address is the device address of kiln_status;
   kilnrt_cuda_rank_address that of kiln_device_rank. */
int *kilnrt_cuda_status_address(void);
long long *kilnrt_cuda_rank_address(void);

#endif
