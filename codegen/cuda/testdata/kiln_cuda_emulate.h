// kiln_cuda_emulate.h: the part of CUDA that Kiln's generated programs
// use, run on the CPU, so that tests here can run a CUDA executable
// (kernels.cu, step.cu, kiln_cuda_runtime.cu and driver.c) without a GPU.
// kiln_cuda.h includes it when KILN_CUDA_EMULATE is defined; compile the
// .cu files as C++17.
//
// Semantics: one host thread runs everything in issue order. A launch
// runs every thread of every block in turn; a cooperative launch runs
// each thread as a fiber (ucontext) that yields at its barriers: the
// threads of one block until all wait at __syncthreads (which releases
// them) or at kiln_grid_sync, then the next block, and the grid barrier
// releases when every thread of the grid waits at it. A barrier that
// some threads pass by (they return, or wait at the other kind) fails
// the launch. The emulated GPU holds 3 blocks at once (3 SMs, one block
// each), so a cooperative grid of more fails to launch, as on a GPU;
// atomics are plain read-modify-writes; streams and events only order
// what already runs in order; a host function runs when issued. Stream
// capture records each operation (a launch's arguments as they were when
// issued, as CUDA does) and a graph launch replays the record. It is
// stricter than CUDA where a Kiln runtime would be wrong: work issued
// during a capture on a stream that has not joined it (CUDA would run it
// at once, outside the graph), a capture that ends before every stream it
// forked has rejoined its origin by a direct wait
// (cudaErrorStreamCaptureUnjoined), and launches beyond 256 threads a
// block (every Kiln kernel's launch bounds) or 65535 blocks in y or z, are
// errors that stay until cudaGetLastError or cudaStreamEndCapture returns
// them (CUDA clears a launch error at the next cudaGetLastError too). Memory from
// cudaMalloc and cudaHostAlloc is filled with the byte 0xFF (NaN in every
// float encoding, so a read of memory nothing wrote shows in the results),
// and every allocation, stream, event and graph is counted, so a test can
// check the runtime frees what it made.
#ifndef KILN_CUDA_EMULATE_H
#define KILN_CUDA_EMULATE_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(n)
// One block runs at a time between barriers, so a block's shared memory
// can be one static object.
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))


struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// The warp matrix functions (mma.h) by their definition: every thread of
// a warp calls them with the same arguments, so each thread here holds
// the whole 16 × 16 matrix of a fragment and computes all of it (the
// accumulator's sums in f32, k ascending). The 16-bit operands are stored
// bits; kiln_cuda.h converts them.
struct __half {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
};
static inline float kiln_bf16_to_f32(unsigned short);
static inline float kiln_f16_to_f32(unsigned short);
static inline float kiln_emu_wide(__nv_bfloat16 h) { return kiln_bf16_to_f32(h.x); }
static inline float kiln_emu_wide(__half h) { return kiln_f16_to_f32(h.x); }
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16 x 16 x 16 fragments only");
  float v[16 * 16];
};
// kiln_emu_wmma_check fails the program where CUDA's rules for a warp
// matrix function are broken: a block of whole warps, a 256-bit aligned
// pointer, a leading dimension of whole 16-byte rows.
static inline void kiln_emu_wmma_check(const void *p, unsigned ldm, size_t elem) {
  if (blockDim.x % 32 != 0 || ((unsigned long long)p & 31) != 0 || (ldm * elem) % 16 != 0) {
    fprintf(stderr, "emulated: a warp matrix function at %p with ldm %u breaks its alignment rules\n", p, ldm);
    abort();
  }
}
template <class Use, class T, class L> static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
  static_assert(sizeof(L) > 0, "row-major operands only");
  kiln_emu_wmma_check(p, ldm, sizeof(T));
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) f.v[i * 16 + j] = kiln_emu_wide(p[i * ldm + j]);
}
template <class Use, class T, class L> static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float x) {
  for (float &e : f.v) e = x;
}
template <class T>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, row_major> &a,
                            const fragment<matrix_b, 16, 16, 16, T, row_major> &b, const fragment<accumulator, 16, 16, 16, float> &c) {
  float out[16 * 16];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float sum = c.v[i * 16 + j];
      for (int k = 0; k < 16; k++) sum += a.v[i * 16 + k] * b.v[k * 16 + j];
      out[i * 16 + j] = sum;
    }
  memcpy(d.v, out, sizeof out);
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t) {
  kiln_emu_wmma_check(p, ldm, sizeof(float));
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) p[i * ldm + j] = f.v[i * 16 + j];
}
}  // namespace wmma
}  // namespace nvcuda

template <class T> static inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
static inline unsigned int atomicCAS(unsigned int *p, unsigned int cmp, unsigned int v) {
  unsigned int old = *p;
  if (old == cmp) *p = v;
  return old;
}

enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidConfiguration = 9,
                 cudaErrorLaunchFailure = 719, cudaErrorCooperativeLaunchTooLarge = 720, cudaErrorStreamCaptureUnsupported = 900,
                 cudaErrorStreamCaptureIsolation = 905, cudaErrorStreamCaptureUnjoined = 904 };
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
typedef void (*cudaHostFn_t)(void *);

struct kiln_emu_graph {
  std::vector<std::function<void()>> ops;
};
struct CUstream_st {
  int id;
  bool captured;     // joined the capture in progress
  long long ops;     // operations issued to it
  long long joined;  // its operations its capture's origin has waited for
};
struct CUevent_st {
  int id;
  CUstream_st *at;  // where it was last recorded, and after how many operations
  long long ops;
  bool captured;
};
typedef CUstream_st *cudaStream_t;
typedef CUevent_st *cudaEvent_t;
typedef kiln_emu_graph *cudaGraph_t;
typedef kiln_emu_graph *cudaGraphExec_t;

// What the emulation holds now: allocations (bytes), streams, events and
// graphs; and how many operations it ran.
struct kiln_emu_counts {
  long long bytes, allocations, streams, events, graphs, launches, replays;
};
inline kiln_emu_counts kiln_emu;
inline kiln_emu_graph *kiln_emu_capture;  // the graph being recorded
inline CUstream_st *kiln_emu_origin;      // the stream that began it
inline std::vector<CUstream_st *> kiln_emu_joined;
inline cudaError_t kiln_emu_error = cudaSuccess;  // sticky, as CUDA's launch errors are
inline long long kiln_emu_device_total = 80LL << 30;

static inline void kiln_emu_issue(cudaStream_t s, std::function<void()> op) {
  if (s) s->ops++;
  if (!kiln_emu_capture) {
    op();
    return;
  }
  if (!s || !s->captured) {
    kiln_emu_error = cudaErrorStreamCaptureIsolation;  // it would run now, outside the graph
    return;
  }
  kiln_emu_capture->ops.push_back(op);
}

// kiln_emu_launch runs (or, under capture, records) kernel k over grid x
// block threads with the arguments as given now.
template <class... P, class... A> static inline void kiln_emu_launch(cudaStream_t s, dim3 grid, dim3 block, void (*k)(P...), A... args) {
  kiln_emu.launches++;
  if ((long long)block.x * block.y * block.z > 256 || grid.y > 65535 || grid.z > 65535 || grid.x == 0 || block.x == 0) {
    kiln_emu_error = cudaErrorInvalidConfiguration;
    return;
  }
  kiln_emu_issue(s, [=] {
    gridDim = grid, blockDim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
      for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++)
          for (unsigned tz = 0; tz < block.z; tz++)
            for (unsigned ty = 0; ty < block.y; ty++)
              for (unsigned tx = 0; tx < block.x; tx++) {
                blockIdx = uint3{bx, by, bz}, threadIdx = uint3{tx, ty, tz};
                k(args...);
              }
  });
}
// The emulated GPU: kiln_emu_sms multiprocessors holding one block of
// 256 threads each.
inline int kiln_emu_sms = 3;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
static inline cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int) {
  if (a != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *v = kiln_emu_sms;
  return cudaSuccess;
}
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int block, size_t) {
  *n = block <= 256 ? 1 : 0;
  return cudaSuccess;
}

// Fibers of a cooperative launch: state 0 runnable, 1 waiting at
// __syncthreads, 2 at kiln_grid_sync, 3 returned.
struct kiln_emu_fiber {
  ucontext_t context;
  char *stack;
  int state;
  uint3 block, thread;
};
enum { kiln_emu_stack_bytes = 1 << 18 };
inline std::vector<kiln_emu_fiber> kiln_emu_fibers;
inline ucontext_t kiln_emu_scheduler;
inline int kiln_emu_running = -1;  // the fiber running, or -1 outside a cooperative launch
inline std::function<void()> kiln_emu_thread;  // what each fiber runs

static void kiln_emu_fiber_main() {
  kiln_emu_thread();
  kiln_emu_fibers[kiln_emu_running].state = 3;  // uc_link resumes the scheduler
}
static inline void kiln_emu_wait(int state) {
  if (kiln_emu_running < 0) {  // a barrier in a kernel launched without fibers
    kiln_emu_error = cudaErrorLaunchFailure;
    return;
  }
  kiln_emu_fiber &f = kiln_emu_fibers[kiln_emu_running];
  f.state = state;
  swapcontext(&f.context, &kiln_emu_scheduler);
}
static inline void __syncthreads() { kiln_emu_wait(1); }
static inline void __threadfence() {}
static inline void kiln_grid_sync() { kiln_emu_wait(2); }

// kiln_emu_cooperative runs thread over grid blocks of 256 fibers; false
// if a barrier is not reached by every thread it must hold.
static inline bool kiln_emu_cooperative(unsigned int grid, std::function<void()> thread) {
  const size_t n = (size_t)grid * 256;
  while (kiln_emu_fibers.size() < n) {
    void *stack = mmap(NULL, kiln_emu_stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED) return false;
    kiln_emu_fibers.push_back(kiln_emu_fiber{{}, (char *)stack, 3, {}, {}});
  }
  kiln_emu_thread = thread;
  for (size_t i = 0; i < n; i++) {
    kiln_emu_fiber &f = kiln_emu_fibers[i];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kiln_emu_stack_bytes;
    f.context.uc_link = &kiln_emu_scheduler;
    makecontext(&f.context, kiln_emu_fiber_main, 0);
    f.state = 0;
    f.block = uint3{(unsigned)(i / 256), 0, 0}, f.thread = uint3{(unsigned)(i % 256), 0, 0};
  }
  gridDim = dim3(grid), blockDim = dim3(256);
  for (;;) {
    for (unsigned b = 0; b < grid; b++) {
      for (;;) {  // block b until each of its threads waits at the grid barrier or returned
        int at[4] = {0, 0, 0, 0};
        for (size_t i = (size_t)b * 256; i < (size_t)(b + 1) * 256; i++) {
          kiln_emu_fiber &f = kiln_emu_fibers[i];
          if (f.state == 0) {
            kiln_emu_running = (int)i;
            blockIdx = f.block, threadIdx = f.thread;
            swapcontext(&kiln_emu_scheduler, &f.context);
            kiln_emu_running = -1;
          }
          at[f.state]++;
        }
        if (at[1] == 0) break;
        if (at[1] != 256) return false;
        for (size_t i = (size_t)b * 256; i < (size_t)(b + 1) * 256; i++) kiln_emu_fibers[i].state = 0;
      }
    }
    size_t waiting = 0, done = 0;
    for (size_t i = 0; i < n; i++) waiting += kiln_emu_fibers[i].state == 2, done += kiln_emu_fibers[i].state == 3;
    if (done == n) return true;
    if (waiting != n) return false;
    for (size_t i = 0; i < n; i++) kiln_emu_fibers[i].state = 0;
  }
}

// kiln_launch_cooperative_as runs (or records) kernel k cooperatively
// over blocks blocks, which the emulated GPU must hold at once.
// With KILN_EMU_NO_COOPERATIVE_CAPTURE set, a cooperative launch during a
// capture fails the capture, as on a CUDA that cannot capture one.
template <class... P> static inline cudaError_t kiln_launch_cooperative_as(void (*k)(P...), unsigned int blocks, cudaStream_t s, P... args) {
  kiln_emu.launches++;
  if (blocks == 0) return cudaErrorInvalidConfiguration;
  if (blocks > (unsigned)kiln_emu_sms) return cudaErrorCooperativeLaunchTooLarge;
  if (kiln_emu_capture && getenv("KILN_EMU_NO_COOPERATIVE_CAPTURE")) {
    kiln_emu_error = cudaErrorStreamCaptureUnsupported;
    return cudaErrorStreamCaptureUnsupported;
  }
  kiln_emu_issue(s, [=] {
    if (!kiln_emu_cooperative(blocks, [=] { k(args...); })) kiln_emu_error = cudaErrorLaunchFailure;
  });
  return cudaSuccess;
}

#define KILN_UNPAREN(...) __VA_ARGS__
#define KILN_LAUNCH(k, grid, block, shared, stream, args) kiln_emu_launch(stream, grid, block, k, KILN_UNPAREN args)

// Device allocations count in kiln_emu.bytes (and cudaMemGetInfo);
// pinned host ones only as allocations.
static inline cudaError_t kiln_emu_alloc(void **p, size_t n, bool device) {
  size_t size = (n + 255) / 256 * 256 + 256;
  void *q = aligned_alloc(256, size);
  if (!q) return cudaErrorMemoryAllocation;
  memset(q, 0xFF, size);
  // The size and the kind are kept in front of the block for the free's count.
  ((size_t *)q)[0] = n, ((size_t *)q)[1] = device;
  *p = (char *)q + 256;
  if (device) kiln_emu.bytes += (long long)n;
  kiln_emu.allocations++;
  return cudaSuccess;
}
static inline cudaError_t kiln_emu_free(void *p, bool device) {
  if (!p) return cudaSuccess;
  char *q = (char *)p - 256;
  if (((size_t *)q)[1] != (size_t)device) return cudaErrorInvalidValue;
  if (device) kiln_emu.bytes -= (long long)((size_t *)q)[0];
  kiln_emu.allocations--;
  free(q);
  return cudaSuccess;
}
static inline cudaError_t cudaMalloc(void **p, size_t n) { return kiln_emu_alloc(p, n, true); }
static inline cudaError_t cudaFree(void *p) { return kiln_emu_free(p, true); }
static inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int) { return kiln_emu_alloc(p, n, false); }
static inline cudaError_t cudaFreeHost(void *p) { return kiln_emu_free(p, false); }
static inline cudaError_t cudaMemset(void *p, int v, size_t n) {
  memset(p, v, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  kiln_emu_issue(s, [=] { memset(p, v, n); });
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) {
  memmove(d, s, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind, cudaStream_t st) {
  kiln_emu_issue(st, [=] { memmove(d, s, n); });
  return cudaSuccess;
}
// Memory counts what was asked for, a one-byte allocation included, as
// the device's free memory falls by at least that.
static inline cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  *free = (size_t)(kiln_emu_device_total - kiln_emu.bytes), *total = (size_t)kiln_emu_device_total;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
  *s = new CUstream_st{(int)kiln_emu.streams++, false, 0, 0};
  return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  kiln_emu.streams--;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) {
  *e = new CUevent_st{(int)kiln_emu.events++, nullptr, 0, false};
  return cudaSuccess;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  kiln_emu.events--;
  return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!s) return cudaErrorInvalidValue;  // the runtime records on its own streams only
  if (kiln_emu_capture && !s->captured) kiln_emu_error = cudaErrorStreamCaptureIsolation;
  e->at = s;
  e->ops = s->ops;
  e->captured = kiln_emu_capture && s->captured;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (kiln_emu_capture && e->captured) {
    if (!s->captured) kiln_emu_joined.push_back(s);
    s->captured = true;
    if (s == kiln_emu_origin && e->at) e->at->joined = e->ops;  // the origin has waited for e's stream up to e
  } else if (kiln_emu_capture && s->captured) {
    kiln_emu_error = cudaErrorStreamCaptureIsolation;  // a captured stream waits for work outside the graph
  }
  return cudaSuccess;
}
static inline cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
  kiln_emu_issue(s, [=] { fn(data); });
  return cudaSuccess;
}
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode) {
  if (kiln_emu_capture) return cudaErrorInvalidValue;
  kiln_emu_capture = new kiln_emu_graph;
  kiln_emu_origin = s;
  s->captured = true;
  kiln_emu_joined.assign(1, s);
  kiln_emu.graphs++;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  if (!kiln_emu_capture || s != kiln_emu_origin) return cudaErrorInvalidValue;
  cudaError_t err = kiln_emu_error;
  for (CUstream_st *j : kiln_emu_joined) {
    if (j != s && j->joined != j->ops && err == cudaSuccess) err = cudaErrorStreamCaptureUnjoined;
    j->captured = false;
  }
  kiln_emu_joined.clear();
  *g = kiln_emu_capture;
  kiln_emu_capture = nullptr;
  kiln_emu_origin = nullptr;
  kiln_emu_error = cudaSuccess;
  if (err != cudaSuccess) {
    // A failed capture gives no graph.
    delete *g;
    kiln_emu.graphs--;
    *g = nullptr;
  }
  return err;
}
static inline cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
  *e = new kiln_emu_graph(*g);
  kiln_emu.graphs++;
  return cudaSuccess;
}
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
  kiln_emu.replays++;
  for (auto &op : e->ops) op();
  return cudaSuccess;
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  kiln_emu.graphs--;
  return cudaSuccess;
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  kiln_emu.graphs--;
  return cudaSuccess;
}
// With KILN_EMU_REPORT set, the process reports at exit what the
// emulation still holds.
inline struct kiln_emu_reporter {
  ~kiln_emu_reporter() {
    if (getenv("KILN_EMU_REPORT"))
      fprintf(stderr, "emulated: %lld bytes in %lld allocations, %lld streams, %lld events, %lld graphs held; %lld launches issued, %lld graph launches\n",
              kiln_emu.bytes, kiln_emu.allocations, kiln_emu.streams, kiln_emu.events, kiln_emu.graphs, kiln_emu.launches, kiln_emu.replays);
  }
} kiln_emu_report;

static inline cudaError_t cudaGetLastError(void) {
  cudaError_t e = kiln_emu_error;
  kiln_emu_error = cudaSuccess;
  return e;
}
static inline const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
  case cudaErrorStreamCaptureUnjoined: return "capture operation not joined to the origin stream";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch";
  }
  return "emulated error";
}
template <class T> static inline cudaError_t cudaGetSymbolAddress(void **p, T &symbol) {
  *p = (void *)&symbol;
  return cudaSuccess;
}

// cuBLAS: the GEMM Kiln calls, as its documentation defines it
// (column-major, op(X) = X or Xᵀ, f32 accumulation in k order, the
// 16-bit types rounded to nearest even), run or recorded like a launch.
// The conversions are kiln_cuda.h's.
static inline float kiln_bf16_to_f32(unsigned short);
static inline unsigned short kiln_f32_to_bf16(float);
static inline float kiln_f16_to_f32(unsigned short);
static inline unsigned short kiln_f32_to_f16(float);
typedef struct kiln_emu_blas *cublasHandle_t;
struct kiln_emu_blas {
  void *workspace;
  cudaStream_t stream;
};
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
  *h = new kiln_emu_blas{nullptr, nullptr};
  kiln_emu.graphs++;  // counted with the other handles the runtime must free
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  kiln_emu.graphs--;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *w, size_t) {
  h->workspace = w;
  return CUBLAS_STATUS_SUCCESS;
}
static inline float kiln_emu_get(const void *p, cudaDataType t, long long i) {
  switch (t) {
  case CUDA_R_16F: return kiln_f16_to_f32(((const unsigned short *)p)[i]);
  case CUDA_R_16BF: return kiln_bf16_to_f32(((const unsigned short *)p)[i]);
  default: return ((const float *)p)[i];
  }
}
static inline void kiln_emu_set(void *p, cudaDataType t, long long i, float v) {
  switch (t) {
  case CUDA_R_16F: ((unsigned short *)p)[i] = kiln_f32_to_f16(v); break;
  case CUDA_R_16BF: ((unsigned short *)p)[i] = kiln_f32_to_bf16(v); break;
  default: ((float *)p)[i] = v;
  }
}
// kiln_emu_gemm issues C_b = alpha·op(A_b)·op(B_b) (+ beta·C_b) (+ bias[i]
// on row i, in f32 before C's rounding) for each batch b.
static inline cublasStatus_t kiln_emu_gemm(cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float al, const void *A,
                                           cudaDataType at, int lda, long long sa, const void *B, cudaDataType bt, int ldb, long long sb, float be, void *C,
                                           cudaDataType ct, int ldc, long long sc, int batch, const float *bias) {
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < (ta == CUBLAS_OP_N ? m : k) || lda < 1 || ldb < (tb == CUBLAS_OP_N ? k : n) || ldb < 1 || ldc < m || ldc < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  kiln_emu.launches++;
  kiln_emu_issue(stream, [=] {
    for (long long b = 0; b < batch; b++)
      for (long long j = 0; j < n; j++)
        for (long long i = 0; i < m; i++) {
          float acc = 0;
          for (long long l = 0; l < k; l++) {
            float x = kiln_emu_get(A, at, b * sa + (ta == CUBLAS_OP_N ? i + l * lda : l + i * lda));
            float y = kiln_emu_get(B, bt, b * sb + (tb == CUBLAS_OP_N ? l + j * ldb : j + l * ldb));
            acc += x * y;
          }
          long long at_c = b * sc + i + j * ldc;
          // beta = 0 ignores C, NaN included, as cuBLAS does.
          float v = be == 0 ? al * acc : al * acc + be * kiln_emu_get(C, ct, at_c);
          if (bias) v += bias[i];
          kiln_emu_set(C, ct, at_c, v);
        }
  });
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                                                        const void *A, cudaDataType at, int lda, long long sa, const void *B, cudaDataType bt, int ldb,
                                                        long long sb, const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                                                        cublasComputeType_t, cublasGemmAlgo_t) {
  return kiln_emu_gemm(h->stream, ta, tb, m, n, k, *(const float *)alpha, A, at, lda, sa, B, bt, ldb, sb, *(const float *)beta, C, ct, ldc, sc, batch, nullptr);
}

// cuBLASLt: the matmul descriptor's transpositions and bias epilogue, and
// layouts of column-major matrices; cublasLtMatmul checks that the
// layouts are the operands' as the descriptor takes them, D is C, and
// runs kiln_emu_gemm. Handles and descriptors count as handles to free.
typedef struct kiln_emu_lt *cublasLtHandle_t;
struct kiln_emu_lt {};
struct kiln_emu_lt_desc {
  cublasComputeType_t compute;
  cudaDataType scale;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int epilogue = 1;
  const float *bias = nullptr;
  cudaDataType bias_type = CUDA_R_32F;
};
typedef kiln_emu_lt_desc *cublasLtMatmulDesc_t;
struct kiln_emu_lt_layout {
  cudaDataType type;
  unsigned long long rows, cols;
  long long ld;
};
typedef kiln_emu_lt_layout *cublasLtMatrixLayout_t;
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
static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  *h = new kiln_emu_lt{};
  kiln_emu.graphs++;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  kiln_emu.graphs--;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType scale) {
  *d = new kiln_emu_lt_desc{compute, scale};
  kiln_emu.graphs++;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  kiln_emu.graphs--;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
  switch (a) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
    if (n != sizeof d->ta) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->ta, v, n);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_TRANSB:
    if (n != sizeof d->tb) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->tb, v, n);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_EPILOGUE:
    if (n != sizeof(cublasLtEpilogue_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->epilogue, v, n);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    if (n != sizeof d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->bias, v, n);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    if (n != sizeof d->bias_type) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->bias_type, v, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, unsigned long long rows, unsigned long long cols, long long ld) {
  *l = new kiln_emu_lt_layout{t, rows, cols, ld};
  kiln_emu.graphs++;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  kiln_emu.graphs--;
  return CUBLAS_STATUS_SUCCESS;
}
// Preferences and the heuristic: the minimum alignments of A, B, C and D
// must hold of the pointers the call gets, and the bias must be 16-byte
// aligned (no preference covers it; some of cuBLASLt's kernels need it).
struct kiln_emu_lt_pref {
  unsigned long long workspace = 0;
  unsigned int align[4] = {256, 256, 256, 256};
};
typedef kiln_emu_lt_pref *cublasLtMatmulPreference_t;
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
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = new kiln_emu_lt_pref;
  kiln_emu.graphs++;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  kiln_emu.graphs--;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n) {
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == sizeof p->workspace) {
    memcpy(&p->workspace, v, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && n == sizeof(unsigned int)) {
    memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], v, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                            cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t p, int want,
                                                            cublasLtMatmulHeuristicResult_t *res, int *found) {
  if (!h || !d || !p || want < 1) return CUBLAS_STATUS_INVALID_VALUE;
  memset(res, 0, sizeof *res);
  memcpy(res->algo.data, p->align, sizeof p->align);  // the alignments promised, for the call to check
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t la,
                                            const void *B, cublasLtMatrixLayout_t lb, const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D,
                                            cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t stream) {
  if (!h || !d || !la || !lb || !lc || C != D || lc != ld || d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  unsigned int align[4] = {256, 256, 256, 256};
  if (algo) memcpy(align, algo->data, sizeof align);
  const void *ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; i++)
    if (align[i] == 0 || (unsigned long long)ptrs[i] % align[i] != 0) {
      fprintf(stderr, "emulated cublasLtMatmul: operand %d at %p is not %u-byte aligned as its algorithm assumes\n", i, ptrs[i], align[i]);
      abort();
    }
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && (unsigned long long)d->bias % 16 != 0) {
    fprintf(stderr, "emulated cublasLtMatmul: the bias at %p is not 16-byte aligned\n", (const void *)d->bias);
    abort();
  }
  unsigned long long m = lc->rows, n = lc->cols, k = d->ta == CUBLAS_OP_N ? la->cols : la->rows;
  if ((d->ta == CUBLAS_OP_N ? la->rows : la->cols) != m || (d->tb == CUBLAS_OP_N ? lb->rows : lb->cols) != k ||
      (d->tb == CUBLAS_OP_N ? lb->cols : lb->rows) != n || la->type != lb->type)
    return CUBLAS_STATUS_INVALID_VALUE;
  const float *bias = nullptr;
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) {
    if (!d->bias || d->bias_type != CUDA_R_32F || lc->type != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
    bias = d->bias;
  } else if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return kiln_emu_gemm(stream, d->ta, d->tb, (int)m, (int)n, (int)k, *(const float *)alpha, A, la->type, (int)la->ld, 0, B, lb->type, (int)lb->ld, 0,
                       *(const float *)beta, D, lc->type, (int)lc->ld, 0, 1, bias);
}

static inline cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }

#if KILN_NCCL
// NCCL over MPI: each rank is an MPI process; a communicator is an MPI
// communicator, and a collective runs (or is recorded) in issue order on
// its stream, as a launch does, through the MPI collective of the same
// meaning. The operands are copied first, so that NCCL's in-place forms
// need no MPI_IN_PLACE.
#include <mpi.h>
struct ncclComm {
  MPI_Comm comm;
  std::vector<std::pair<MPI_Request, std::vector<char> *>> sends;  // ncclSend's, in flight
};
typedef ncclComm *ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclUint8 = 1, ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8 } ncclDataType_t;
#define NCCL_SPLIT_NOCOLOR -1
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;
typedef struct ncclConfig_v21700 ncclConfig_t;
inline long long kiln_emu_comms;  // communicators held
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 7, sizeof *id);
  return ncclSuccess;
}
static inline ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank) {
  int size = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (n != size || rank != me || id.internal[0] != 7) return ncclInvalidArgument;
  *c = new ncclComm;
  MPI_Comm_dup(MPI_COMM_WORLD, &(*c)->comm);
  kiln_emu_comms++;
  return ncclSuccess;
}
static inline ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *) {
  MPI_Comm comm;
  MPI_Comm_split(c->comm, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &comm);
  *out = nullptr;
  if (comm == MPI_COMM_NULL) return ncclSuccess;  // this rank is in none of the new communicators
  *out = new ncclComm;
  (*out)->comm = comm;
  kiln_emu_comms++;
  return ncclSuccess;
}
static inline ncclResult_t ncclCommDestroy(ncclComm_t c) {
  for (auto &p : c->sends) {
    MPI_Wait(&p.first, MPI_STATUS_IGNORE);
    delete p.second;
  }
  MPI_Comm_free(&c->comm);
  delete c;
  kiln_emu_comms--;
  return ncclSuccess;
}
static inline MPI_Datatype kiln_emu_mpi_type(ncclDataType_t t) {
  return t == ncclUint8 ? MPI_BYTE : t == ncclFloat32 ? MPI_FLOAT : t == ncclFloat64 ? MPI_DOUBLE : MPI_LONG_LONG;
}
static inline size_t kiln_emu_nccl_size(ncclDataType_t t) { return t == ncclUint8 ? 1 : t == ncclFloat32 ? 4 : 8; }
static inline MPI_Op kiln_emu_mpi_op(ncclRedOp_t op) { return op == ncclSum ? MPI_SUM : op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX : MPI_MIN; }
static inline int kiln_emu_comm_size(ncclComm_t c) {
  int n = 0;
  MPI_Comm_size(c->comm, &n);
  return n;
}
static inline ncclResult_t ncclAllReduce(const void *src, void *dst, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  kiln_emu_issue(s, [=] {
    std::vector<char> in((const char *)src, (const char *)src + n * kiln_emu_nccl_size(t));
    MPI_Allreduce(in.data(), dst, (int)n, kiln_emu_mpi_type(t), kiln_emu_mpi_op(op), c->comm);
  });
  return ncclSuccess;
}
static inline ncclResult_t ncclReduceScatter(const void *src, void *dst, size_t recv, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  kiln_emu_issue(s, [=] {
    std::vector<char> in((const char *)src, (const char *)src + recv * kiln_emu_comm_size(c) * kiln_emu_nccl_size(t));
    MPI_Reduce_scatter_block(in.data(), dst, (int)recv, kiln_emu_mpi_type(t), kiln_emu_mpi_op(op), c->comm);
  });
  return ncclSuccess;
}
static inline ncclResult_t ncclAllGather(const void *src, void *dst, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
  kiln_emu_issue(s, [=] {
    std::vector<char> in((const char *)src, (const char *)src + n * kiln_emu_nccl_size(t));
    MPI_Allgather(in.data(), (int)n, kiln_emu_mpi_type(t), dst, (int)n, kiln_emu_mpi_type(t), c->comm);
  });
  return ncclSuccess;
}
// ncclSend and ncclRecv: NCCL pairs a communicator's sends and receives
// between two ranks in issue order, as MPI does one source's messages of
// one tag. A send copies its bytes and goes at once (MPI_Isend, complete
// by the time its communicator is destroyed), so that a rank that runs
// its streams' work in issue order does not wait on it; a receive
// waits. The peer is a rank of the communicator, and the counts match.
static inline ncclResult_t ncclSend(const void *src, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  if (peer < 0 || peer >= kiln_emu_comm_size(c) || n * kiln_emu_nccl_size(t) > 2147483647u) return ncclInvalidArgument;
  kiln_emu_issue(s, [=] {
    auto *copy = new std::vector<char>((const char *)src, (const char *)src + n * kiln_emu_nccl_size(t));
    MPI_Request req;
    MPI_Isend(copy->data(), (int)copy->size(), MPI_BYTE, peer, 0, c->comm, &req);
    for (size_t i = 0; i < c->sends.size();) {  // drop the copies of sends that have gone
      int done = 0;
      MPI_Test(&c->sends[i].first, &done, MPI_STATUS_IGNORE);
      if (!done) {
        i++;
        continue;
      }
      delete c->sends[i].second;
      c->sends.erase(c->sends.begin() + (long)i);
    }
    c->sends.push_back({req, copy});
  });
  return ncclSuccess;
}
static inline ncclResult_t ncclRecv(void *dst, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  if (peer < 0 || peer >= kiln_emu_comm_size(c) || n * kiln_emu_nccl_size(t) > 2147483647u) return ncclInvalidArgument;
  kiln_emu_issue(s, [=] {
    MPI_Status st;
    int got = -1;
    MPI_Recv(dst, (int)(n * kiln_emu_nccl_size(t)), MPI_BYTE, peer, 0, c->comm, &st);
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != (int)(n * kiln_emu_nccl_size(t))) {
      fprintf(stderr, "emulated ncclRecv: %d bytes came, %zu expected\n", got, n * kiln_emu_nccl_size(t));
      abort();
    }
  });
  return ncclSuccess;
}
static inline ncclResult_t ncclBroadcast(const void *src, void *dst, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t s) {
  kiln_emu_issue(s, [=] {
    int me = 0;
    MPI_Comm_rank(c->comm, &me);
    if (me == root) memmove(dst, src, n * kiln_emu_nccl_size(t));
    MPI_Bcast(dst, (int)n, kiln_emu_mpi_type(t), root, c->comm);
  });
  return ncclSuccess;
}
#endif

#endif
