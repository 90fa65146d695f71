/* The device runtime for GPU code outside the kernels: the streams, events,
 * device count and error words of the CUDA runtime behind mal_gpu_* names
 * and untyped handles, so that a caller (comm/comm_nccl.c) includes no CUDA
 * header of its own.  A HIP build (RCCL for the data plane) would map the
 * same names to hip* in a runtime.c of its own, as IOR's gpu_runtime.h has
 * one implementation per runtime.  Built with the CUDA backend
 * (runtime.c maps every call to cuda*).
 *
 * Every function is Local and thin: it does what the runtime call named
 * beside it does, on the calling thread's current device, and returns 0 or
 * the runtime's own nonzero error code (a cudaError_t), which
 * mal_gpu_error_string and mal_gpu_error_name put into words.  Turning that
 * code into a MAL_E* error is the caller's job: it knows what it was
 * doing.  Handles are created and destroyed by the caller. */
#ifndef MAL_GPU_RUNTIME_H
#define MAL_GPU_RUNTIME_H

/* The runtime's own handles (cudaStream_t, cudaEvent_t), untyped here so
 * that NCCL's (or RCCL's) calls take them as they are, and a kernel
 * instance's native queue (mal_kern_native_queue) is a stream. */
typedef void *mal_gpu_stream;
typedef void *mal_gpu_event;

/* cudaGetDeviceCount: *n = the GPUs this process may use. */
int mal_gpu_device_count(int *n);

/* cudaStreamCreateWithFlags(cudaStreamNonBlocking): a stream that does not
 * wait for the legacy default stream. */
int mal_gpu_stream_create(mal_gpu_stream *s);
/* cudaStreamDestroy, cudaStreamSynchronize (the host waits for s). */
int mal_gpu_stream_destroy(mal_gpu_stream s);
int mal_gpu_stream_sync(mal_gpu_stream s);
/* cudaStreamWaitEvent: work queued on s after this waits for ev's record. */
int mal_gpu_stream_wait_event(mal_gpu_stream s, mal_gpu_event ev);

/* cudaEventCreateWithFlags(cudaEventDisableTiming): an event for ordering
 * only. */
int mal_gpu_event_create(mal_gpu_event *ev);
/* cudaEventCreate (timing on): for mal_gpu_event_elapsed. */
int mal_gpu_event_create_timed(mal_gpu_event *ev);
int mal_gpu_event_destroy(mal_gpu_event ev);
/* cudaEventElapsedTime: *ms between two completed timed events. */
int mal_gpu_event_elapsed(float *ms, mal_gpu_event start, mal_gpu_event end);
/* cudaEventRecord: ev completes when what is queued on s so far has. */
int mal_gpu_event_record(mal_gpu_event ev, mal_gpu_stream s);
/* cudaEventQuery without waiting: *done = 1 when ev has completed, 0 while
 * it has not (which is no error). */
int mal_gpu_event_query(mal_gpu_event ev, int *done);

/* cudaGetLastError, its answer dropped: after a failed call, resets the
 * thread's last error so that a later call does not report it again. */
void mal_gpu_clear_error(void);
/* cudaGetErrorString, cudaGetErrorName: static strings. */
const char *mal_gpu_error_string(int e);
const char *mal_gpu_error_name(int e);

#endif /* MAL_GPU_RUNTIME_H */
