// kiln_cuda.h: what Kiln's generated CUDA sources (kernels.cu, and for an
// executable step.cu and kiln_cuda_runtime.cu) need from CUDA. Under nvcc
// (or clang with the CUDA headers) it is the real runtime; for a syntax
// check without them (clang -x cuda -nocudainc -nocudalib -fsyntax-only)
// it declares the builtins the kernels use (the math functions for the
// host too: host functions update offloaded parameters) and the subset
// of the runtime API the host side calls, with CUDA 12's signatures. With
// KILN_CUDA_EMULATE, kiln_cuda_emulate.h (Kiln's tests) runs it all on
// the CPU.
//
// KILN_LAUNCH(kernel, grid, block, shared, stream, (args...)) launches a
// kernel; the host side launches every kernel through it, but the
// cooperative ones (kiln_launch_cooperative, below).
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#if defined(__NVCC__) || defined(__CUDA_ARCH_LIST__) || defined(KILN_USE_CUDA_HEADERS)
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#if KILN_NCCL
#include <nccl.h>
#endif
#define KILN_LAUNCH(k, grid, block, shared, stream, args) k<<<grid, block, shared, stream>>> args
#elif defined(KILN_CUDA_EMULATE)
#include "kiln_cuda_emulate.h"
#else
#include <stddef.h>
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __launch_bounds__(n) __attribute__((launch_bounds(n)))
struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  __host__ __device__ dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};
extern const __device__ uint3 threadIdx;
extern const __device__ uint3 blockIdx;
extern const __device__ dim3 blockDim;
extern const __device__ dim3 gridDim;
#define __shared__ __attribute__((shared))
#define __align__(n) __attribute__((aligned(n)))
// The 16-bit types and the warp matrix functions (mma.h) the tiled
// products of 16-bit operands use.
struct __half {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
};
namespace nvcuda {
namespace wmma {
struct matrix_a;
struct matrix_b;
struct accumulator;
struct row_major;
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  T x[8];
};
template <class Use, int M, int N, int K, class T, class L> __device__ void load_matrix_sync(fragment<Use, M, N, K, T, L> &, const T *, unsigned);
template <class Use, int M, int N, int K, class T, class L> __device__ void fill_fragment(fragment<Use, M, N, K, T, L> &, const T &);
template <int M, int N, int K, class T>
__device__ void mma_sync(fragment<accumulator, M, N, K, float> &, const fragment<matrix_a, M, N, K, T, row_major> &, const fragment<matrix_b, M, N, K, T, row_major> &,
                         const fragment<accumulator, M, N, K, float> &);
template <int M, int N, int K> __device__ void store_matrix_sync(float *, const fragment<accumulator, M, N, K, float> &, unsigned, layout_t);
}  // namespace wmma
}  // namespace nvcuda
extern "C" __device__ void __syncthreads(void);
extern "C" __device__ void __threadfence(void);
extern "C" {
__host__ __device__ float sqrtf(float);
__host__ __device__ float expf(float);
__host__ __device__ float logf(float);
__host__ __device__ float tanhf(float);
__host__ __device__ float erff(float);
__host__ __device__ float powf(float, float);
__host__ __device__ float fmodf(float, float);
__host__ __device__ float fabsf(float);
__host__ __device__ float expm1f(float);
__host__ __device__ float log1pf(float);
__host__ __device__ float floorf(float);
__host__ __device__ float ceilf(float);
__host__ __device__ float rintf(float);
__host__ __device__ float sinf(float);
__host__ __device__ float cosf(float);
__host__ __device__ float tanf(float);
__host__ __device__ float asinf(float);
__host__ __device__ float acosf(float);
__host__ __device__ float atanf(float);
__host__ __device__ float sinhf(float);
__host__ __device__ float coshf(float);
__host__ __device__ float asinhf(float);
__host__ __device__ float acoshf(float);
__host__ __device__ float atanhf(float);
__host__ __device__ double sqrt(double);
__host__ __device__ double exp(double);
__host__ __device__ double log(double);
__host__ __device__ double tanh(double);
__host__ __device__ double erf(double);
__host__ __device__ double pow(double, double);
__host__ __device__ double fmod(double, double);
__host__ __device__ double fabs(double);
__host__ __device__ double expm1(double);
__host__ __device__ double log1p(double);
__host__ __device__ double floor(double);
__host__ __device__ double ceil(double);
__host__ __device__ double rint(double);
__host__ __device__ double sin(double);
__host__ __device__ double cos(double);
__host__ __device__ double tan(double);
__host__ __device__ double asin(double);
__host__ __device__ double acos(double);
__host__ __device__ double atan(double);
__host__ __device__ double sinh(double);
__host__ __device__ double cosh(double);
__host__ __device__ double asinh(double);
__host__ __device__ double acosh(double);
__host__ __device__ double atanh(double);
}
__device__ float atomicAdd(float *, float);
__device__ double atomicAdd(double *, double);
__device__ int atomicAdd(int *, int);
__device__ unsigned long long atomicAdd(unsigned long long *, unsigned long long);
__device__ unsigned int atomicAdd(unsigned int *, unsigned int);
__device__ unsigned int atomicCAS(unsigned int *, unsigned int, unsigned int);

enum cudaError { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef void (*cudaHostFn_t)(void *);
extern "C" {
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaHostAlloc(void **, size_t, unsigned int);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaMemset(void *, int, size_t);
cudaError_t cudaMemsetAsync(void *, int, size_t, cudaStream_t);
cudaError_t cudaMemcpy(void *, const void *, size_t, enum cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemGetInfo(size_t *, size_t *);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned int);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *, unsigned int);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int);
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t, void *);
cudaError_t cudaGetDevice(int *);
cudaError_t cudaDeviceGetAttribute(int *, enum cudaDeviceAttr, int);
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *, const void *, int, size_t);
cudaError_t cudaLaunchCooperativeKernel(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
cudaError_t cudaGraphDestroy(cudaGraph_t);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t);
int cudaConfigureCall(dim3, dim3, size_t = 0, cudaStream_t = 0);
}
template <class T> cudaError_t cudaGetSymbolAddress(void **, const T &);

typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *);
cublasStatus_t cublasDestroy_v2(cublasHandle_t);
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void *, size_t);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *, const void *, cudaDataType, int,
                                          long long, const void *, cudaDataType, int, long long, const void *, void *, cudaDataType, int, long long, int,
                                          cublasComputeType_t, cublasGemmAlgo_t);
}
// cuBLASLt, for GEMMs with a bias epilogue (CUDA 12's signatures).
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_t *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_t *cublasLtMatrixLayout_t;
typedef struct {
  unsigned long long data[8];
} cublasLtMatmulAlgo_t;
typedef enum {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26
} cublasLtMatmulDescAttributes_t;
typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 } cublasLtEpilogue_t;
typedef struct cublasLtMatmulPreferenceOpaque_t *cublasLtMatmulPreference_t;
typedef enum {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;
extern "C" {
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *);
cublasStatus_t cublasLtCreate(cublasLtHandle_t *);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *, cudaDataType, unsigned long long, unsigned long long, long long);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t, const void *,
                              cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);
}
// NCCL, for a program of several ranks (NCCL 2.18's signatures).
typedef struct ncclComm *ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef enum { ncclSuccess = 0 } ncclResult_t;
typedef enum { ncclUint8 = 1, ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8 } ncclDataType_t;
#define NCCL_SPLIT_NOCOLOR -1
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;
typedef struct ncclConfig_v21700 ncclConfig_t;
extern "C" {
ncclResult_t ncclGetUniqueId(ncclUniqueId *);
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
ncclResult_t ncclCommDestroy(ncclComm_t);
const char *ncclGetErrorString(ncclResult_t);
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaSetDevice(int);
cudaError_t cudaMemcpyToSymbol(const void *, const void *, size_t, size_t, enum cudaMemcpyKind);
}
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasSetWorkspace cublasSetWorkspace_v2
#define KILN_LAUNCH(k, grid, block, shared, stream, args) k<<<grid, block, shared, stream>>> args
#endif

#ifndef KILN_CUDA_HOST_ONLY  // defined by the host runtime, which is another translation unit
// kiln_status is 0 until a kernel meets a gather index or a cross-entropy
// label outside its dimension; it then becomes 1 (the index is clamped, so
// no access leaves its buffer). The runtime reads it after the last launch
// (cudaMemcpyFromSymbol) and treats a nonzero status as a failed step.
__device__ int kiln_status;

// kiln_device_rank is this process's rank among the plan's ranks, which
// the host runtime copies there from the driver's kiln_world_rank before
// the first step: random ops of data-parallel ranks start their counters
// from it.
__device__ long long kiln_device_rank;
#endif

#ifndef KILN_CUDA_EMULATE  // the emulation has its own barrier and launch
#ifndef KILN_CUDA_HOST_ONLY
// kiln_grid_sync is a barrier of every thread of a cooperative launch
// (whose blocks the GPU holds all at once, so none waits on a block that
// cannot start): what any thread wrote before it, every thread reads
// after it. One thread per block arrives; the last to arrive resets the
// count and opens the next generation, which the others wait for. The
// count is the module's: cooperative kernels run one at a time, all on
// the compute stream.
__device__ unsigned int kiln_grid_arrived;
__device__ unsigned int kiln_grid_generation;
static __device__ inline void kiln_grid_sync(void) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int *generation = &kiln_grid_generation;
    const unsigned int g = *generation;
    __threadfence();
    if (atomicAdd(&kiln_grid_arrived, 1u) == gridDim.x - 1) {
      kiln_grid_arrived = 0;
      __threadfence();
      *generation = g + 1;
    } else {
      while (*generation == g) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

template <class... P> static inline cudaError_t kiln_launch_cooperative_as(void (*k)(P...), unsigned int blocks, cudaStream_t s, P... args) {
  void *argv[] = {(void *)&args...};
  return cudaLaunchCooperativeKernel((const void *)k, dim3(blocks), dim3(256), argv, 0, s);
}
#endif
#endif

#ifndef KILN_CUDA_HOST_ONLY
// kiln_block_fold folds v over the 256 threads of the block (op 0: sum,
// 1: max, 2: min; a NaN wins a max or min, as in the kernels) and gives
// every thread the result. Every thread of the block must call it.
template <class T> static __device__ inline T kiln_fold2(T a, T b, int op) {
  if (op == 0) return a + b;
  if (op == 1) return (a != a || a > b) ? a : b;
  return (a != a || a < b) ? a : b;
}
template <class T> static __device__ inline T kiln_block_fold(T v, int op) {
  __shared__ T kiln_folding[256];
  __syncthreads();  // the last fold's result has been read
  kiln_folding[threadIdx.x] = v;
  __syncthreads();
  for (unsigned int h = 128; h > 0; h >>= 1) {
    if (threadIdx.x < h) kiln_folding[threadIdx.x] = kiln_fold2(kiln_folding[threadIdx.x], kiln_folding[threadIdx.x + h], op);
    __syncthreads();
  }
  return kiln_folding[0];
}

// kiln_cooperative_blocks is how many blocks of 256 threads of kernel k
// the GPU holds at once (0 if it cannot say), asked once per kernel.
static inline int kiln_cooperative_blocks(const void *k) {
  static const void *kernel[65536];
  static int blocks[65536], known;
  for (int i = 0; i < known; i++)
    if (kernel[i] == k) return blocks[i];
  int device = 0, sms = 0, per = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, 256, 0) != cudaSuccess)
    return 0;
  if (known < 65536) kernel[known] = k, blocks[known++] = sms * per;
  return sms * per;
}

// kiln_launch_cooperative launches kernel k (256 threads a block, whose
// blocks loop over its work) cooperatively on stream s with at most
// blocks blocks, and no more than the GPU holds at once.
template <class... P, class... A> static inline cudaError_t kiln_launch_cooperative(void (*k)(P...), unsigned int blocks, cudaStream_t s, A... args) {
  const int most = kiln_cooperative_blocks((const void *)k);
  if (most < 1) return cudaErrorInvalidConfiguration;
  if (blocks > (unsigned int)most) blocks = (unsigned int)most;
  return kiln_launch_cooperative_as<P...>(k, blocks, s, (P)args...);
}
#endif

// The bits of a float, and back.
__host__ __device__ static inline unsigned int kiln_bits(float f) {
  union { float f; unsigned int u; } c;
  c.f = f;
  return c.u;
}
__host__ __device__ static inline float kiln_float(unsigned int u) {
  union { float f; unsigned int u; } c;
  c.u = u;
  return c.f;
}

// bfloat16: the high half of a float, rounded to nearest even.
__host__ __device__ static inline float kiln_bf16_to_f32(unsigned short h) { return kiln_float((unsigned int)h << 16); }
__host__ __device__ static inline unsigned short kiln_f32_to_bf16(float f) {
  unsigned int u = kiln_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// IEEE half, rounded to nearest even (subnormals included).
__host__ __device__ static inline float kiln_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1fu) return kiln_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    float m = (float)man * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -m : m;
  }
  return kiln_float(sign | ((exp + 112u) << 23) | (man << 13));
}
__host__ __device__ static inline unsigned short kiln_f32_to_f16(float f) {
  unsigned int u = kiln_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to infinity
  if (a < 0x38800000u) {  // subnormal or zero: round a * 2^24 to an integer
    float m = kiln_float(a) * 16777216.0f;
    unsigned int i = (unsigned int)m;
    float rest = m - (float)i;
    if (rest > 0.5f || (rest == 0.5f && (i & 1u))) i++;
    return (unsigned short)(sign | i);
  }
  unsigned int r = a + 0xfffu + ((a >> 13) & 1u);
  return (unsigned short)(sign | ((r - 0x38000000u) >> 13));
}

// Adds to a 16-bit float in place (there is no 16-bit atomicAdd before
// sm_70 for these encodings): compare-and-swap on the 32-bit word.
__device__ static inline void kiln_atomic_add_16(unsigned short *p, float v, bool bf16) {
  unsigned int *word = (unsigned int *)((unsigned long long)p & ~3ull);
  unsigned int shift = ((unsigned long long)p & 2ull) ? 16u : 0u;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    unsigned short h = (unsigned short)(assumed >> shift);
    float sum = (bf16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h)) + v;
    unsigned short n = bf16 ? kiln_f32_to_bf16(sum) : kiln_f32_to_f16(sum);
    unsigned int next = (assumed & ~(0xffffu << shift)) | ((unsigned int)n << shift);
    old = atomicCAS(word, assumed, next);
  } while (old != assumed);
}

// Float to int64 as Kiln's Convert defines it: truncation toward zero,
// saturating at the int64 range, NaN to 0.
__host__ __device__ static inline long long kiln_f2ll(double x) {
  if (x != x) return 0;
  if (x >= 9223372036854775808.0) return 9223372036854775807LL;
  if (x <= -9223372036854775808.0) return -9223372036854775807LL - 1;
  return (long long)x;
}

// Float to uint64 likewise: saturating at 0 and 2^64-1, NaN to 0.
__host__ __device__ static inline unsigned long long kiln_f2ull(double x) {
  if (!(x > 0)) return 0;
  if (x >= 18446744073709551616.0) return 18446744073709551615ull;
  return (unsigned long long)x;
}

// Unsigned a^b: by squaring, wrapping.
__host__ __device__ static inline unsigned long long kiln_upow(unsigned long long a, unsigned long long b) {
  unsigned long long r = 1;
  for (; b; b >>= 1) {
    if (b & 1) r *= a;
    a *= a;
  }
  return r;
}

// Integer a^b as Kiln's Pow defines it: by squaring, wrapping; for b < 0
// the truncated 1/a^-b.
__host__ __device__ static inline long long kiln_ipow(long long a, long long b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
  unsigned long long r = 1, x = (unsigned long long)a;
  for (unsigned long long n = (unsigned long long)b; n; n >>= 1) {
    if (n & 1) r *= x;
    x *= x;
  }
  return (long long)r;
}

// SplitMix64's finaliser: dropout's counter-based random numbers.
__host__ __device__ static inline long long kiln_mix(long long x) {
  unsigned long long z = (unsigned long long)x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (long long)(z ^ (z >> 31));
}

#endif
