/* runtime.h on the CUDA runtime: each mal_gpu_* call is the cuda* call
 * runtime.h names beside it, with the error code passed through as an
 * int. */
#include "runtime.h"

#include <cuda_runtime_api.h>

int mal_gpu_device_count(int *n)
{
    return (int)cudaGetDeviceCount(n);
}

int mal_gpu_stream_create(mal_gpu_stream *s)
{
    cudaStream_t st = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    *s = st;
    return (int)e;
}

int mal_gpu_stream_destroy(mal_gpu_stream s)
{
    return (int)cudaStreamDestroy((cudaStream_t)s);
}

int mal_gpu_stream_sync(mal_gpu_stream s)
{
    return (int)cudaStreamSynchronize((cudaStream_t)s);
}

int mal_gpu_stream_wait_event(mal_gpu_stream s, mal_gpu_event ev)
{
    return (int)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);
}

int mal_gpu_event_create(mal_gpu_event *ev)
{
    cudaEvent_t e0 = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&e0, cudaEventDisableTiming);
    *ev = e0;
    return (int)e;
}

int mal_gpu_event_create_timed(mal_gpu_event *ev)
{
    cudaEvent_t e0 = NULL;
    cudaError_t e = cudaEventCreate(&e0);
    *ev = e0;
    return (int)e;
}

int mal_gpu_event_elapsed(float *ms, mal_gpu_event start, mal_gpu_event end)
{
    return (int)cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
}

int mal_gpu_event_destroy(mal_gpu_event ev)
{
    return (int)cudaEventDestroy((cudaEvent_t)ev);
}

int mal_gpu_event_record(mal_gpu_event ev, mal_gpu_stream s)
{
    return (int)cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
}

int mal_gpu_event_query(mal_gpu_event ev, int *done)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    return e == cudaErrorNotReady ? 0 : (int)e;
}

void mal_gpu_clear_error(void)
{
    (void)cudaGetLastError();
}

const char *mal_gpu_error_string(int e)
{
    return cudaGetErrorString((cudaError_t)e);
}

const char *mal_gpu_error_name(int e)
{
    return cudaGetErrorName((cudaError_t)e);
}
