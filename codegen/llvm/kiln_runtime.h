/* kiln_runtime.h: the C ABI of a step compiled by Kiln
   (kiln compile IN --target llvm --emit lib -o step.so).

   A step is a runtime object. kiln_create makes one: it allocates every
   argument (parameters, state, data inputs) and fills it from the value
   the program embeds (zero where it embeds none), the arena, the kernel
   workspace (sized on the first run, then kept) and a thread pool shared
   by every step of the process. kiln_run runs the step once: it reads the
   arguments, writes the results into the arena and updates the inout
   arguments (parameters, optimizer state, the step count, batch-norm
   statistics) in place; it allocates nothing after the first run. A step
   is not safe to use from two threads at once; runs of different steps
   of one library take turns.

   Tensors are numbered as kiln_descriptor lists them: arguments first
   (index i < the number of arguments), then results. Each is dense,
   row-major, little-endian, its dtype and shape as the descriptor says.

   Errors: a function returning int returns 0 on success and -1 on error,
   with kiln_error(step) saying why; kiln_create returns NULL when memory
   runs out. No function exits the process or prints. */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_step kiln_step;

/* kiln_descriptor is a JSON object describing the step: "entry",
   "arena_bytes", "workspace_bytes" (the largest kernel's temporaries;
   the workspace adds a packed matrix panel per thread), and "tensors", a list of {"index", "name", "kind"
   ("param", "state", "input" or "result"), "role" (for state: "lr",
   "step", "optimizer_state", "running_stat", "loss_scale" or "state";
   for results: "loss", "grad", ... or ""), "dtype", "shape", "bytes",
   "inout", "embedded", and for a running statistic "updates": how many times a step updates it, one
   per batch-norm application}. The string is static. */
const char *kiln_descriptor(void);

/* kiln_create makes a step whose parallel loops use at most threads
   threads (0: the cores online). It returns NULL when memory runs out,
   or when the arena and arguments together exceed the machine's
   physical memory. */
kiln_step *kiln_create(int threads);
void kiln_destroy(kiln_step *s);

/* kiln_run runs the step once. A label or gather index outside its
   dimension is an error: the results must then not be used, and no
   argument the step updates in place (parameters, optimizer state,
   running statistics, the step count, the random position) has
   changed. */
int kiln_run(kiln_step *s);

/* kiln_count is the number of tensors; kiln_find the index of the tensor
   named name (arguments before results), or -1. */
int kiln_count(void);
int kiln_find(const char *name);

/* kiln_data is tensor i's memory: an argument's buffer (or the caller's
   memory kiln_bind gave it), a result's place in the arena, valid until
   the next run (NULL for a result before a run has succeeded, or after
   one failed). kiln_bytes is its size in bytes. */
void *kiln_data(kiln_step *s, int i);
long long kiln_bytes(int i);

/* kiln_set copies bytes into argument i (bytes must be its size): a
   parameter or state into the memory the step uses for it (shared by
   kiln_bind, or its own); a data input into its own buffer (a data input
   bound by kiln_bind is unbound, the caller's memory never written).
   kiln_get copies tensor i out. */
int kiln_set(kiln_step *s, int i, const void *src, long long bytes);
int kiln_get(kiln_step *s, int i, void *dst, long long bytes);

/* kiln_bind makes argument i use the caller's memory (no copy) until it
   is bound again: a data input reads it; a parameter or state reads and
   updates it in place (two steps of one model, a training step and its
   eval step, share their weights so), its own buffer freed. NULL returns
   a data input to its own buffer, and gives a parameter or state a
   buffer of its own again, holding what the shared memory held. The
   memory must hold kiln_bytes(i) bytes, 64-byte aligned for a parameter
   or state, and stay valid while the step runs. */
int kiln_bind(kiln_step *s, int i, void *data);

/* kiln_save writes every parameter and state tensor to path, an .npz
   archive as numpy.savez writes it (member NAME.npy for each), through a
   temporary file renamed into place; kiln_load reads such an archive
   (every parameter and state tensor must be in it, with its dtype and
   shape) and changes nothing when it fails; it reads a regular file
   only (a FIFO or a device is refused without blocking). */
int kiln_save(kiln_step *s, const char *path);
int kiln_load(kiln_step *s, const char *path);

/* The profile. kiln_profile(1) clears it and times every kernel of the
   runs that follow (kiln_profile(0) stops); kiln_kernel reports kernel k
   (k < kiln_kernels()): its name, the bytes it reads and writes and its
   FLOPs by the cost model, and the calls and seconds measured. Returns
   0, or -1 for no such kernel. The profile is the library's, shared by
   its steps. */
void kiln_profile(int on);
int kiln_kernels(void);
int kiln_kernel(int k, const char **name, long long *bytes, long long *flops, long long *calls, double *seconds);

/* kiln_error is the message of the last error on s. */
const char *kiln_error(kiln_step *s);

#ifdef __cplusplus
}
#endif

#endif
