/* kiln_program.h: what a compiled step's generated tables (program.c)
   tell the fixed runtime (runtime.c) and executable (driver.c). Internal
   to one build, not an ABI: kiln_runtime.h is the ABI. */
#ifndef KILN_PROGRAM_H
#define KILN_PROGRAM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of the step, in the runtime's order: parameters and state,
   data inputs, results. */
typedef struct {
	const char *name;  /* argument or result name */
	const char *file;  /* its file under --output-dir, without .npy */
	int kind, slot;    /* 0 a parameter or state (params[slot]), 1 a data input (inputs[slot]), 2 a result (outputs[slot]) */
	const char *descr; /* .npy descr */
	int rank;
	const long long *shape;
	long long bytes;
	int elem_bytes;
	int inout;
	const unsigned char *init; /* the embedded initial value, or NULL */
	int splat;                 /* init is one element, every element's value */
	const char *type;          /* dtype[shape], for --help */
} kiln_tensor_info;

/* What the profile reports of a kernel besides its time: the bytes it
   reads and writes and its FLOPs, by the cost model. */
typedef struct {
	const char *name;
	long long bytes, flops;
} kiln_kernel_info;

typedef struct {
	const char *entry; /* the entry point's name */
	int ntensors, nparams, ninputs, nresults, nkernels;
	int status_index_out_of_range; /* the entry point's status for a bad index */
	long long arena_bytes;
	int ranks;   /* MPI ranks the executable runs as */
	int threads; /* the executable's threads (0: the cores online) */
	const kiln_tensor_info *tensors;
	const kiln_kernel_info *kernels;
	const char *descriptor; /* kiln_descriptor's JSON */
} kiln_program_info;

extern const kiln_program_info kilnrt_program;

/* kilnrt_npy_header writes t's .npy header to h (KILN_NPY_HEADER_MAX bytes)
   and returns its length, or -1 when the shape does not fit (runtime.c:
   checkpoints; driver.c: results). */
enum { KILN_NPY_HEADER_MAX = 1024 };
int kilnrt_npy_header(const kiln_tensor_info *t, unsigned char *h);

/* kilnrt_save writes the parameter and state tensors pv[slot] (host
   memory) to the .npz archive path, through path.tmp renamed into place;
   kilnrt_load reads such an archive into them and changes nothing when
   it fails (checkpoint.c). Both return 0, or -1 with the reason in err. */
int kilnrt_save(void *const *pv, const char *path, char *err, size_t errlen);
int kilnrt_load(void *const *pv, const char *path, char *err, size_t errlen);

/* kilnrt_entry calls the step's entry point. */
int kilnrt_entry(void *arena, void **params, void **inputs, void **outputs);

#ifdef __cplusplus
}
#endif

#endif
