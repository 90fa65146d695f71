/* cuDNN's attention graphs (kernels/cuda/cudnn.c) are accepted by cuDNN's
 * engines -- checked without a GPU.  cuDNN can plan for a described device
 * (its JSON form of the device properties, here an H100 SXM's), and its
 * runtime-compiled engines, the ones that take attention, decide whether
 * they support a graph once libcuda.so.1 is loaded: the CUDA toolkit's stub
 * library is loaded for that where no driver is.  Each shape's forward and
 * backward graph must be offered at least one engine configuration; a graph
 * that drifts out of the pattern cuDNN recognises as scaled dot-product
 * attention gets none (a broken graph was seen to get 0).
 *
 * What this cannot check: that the plans load and compute the right
 * numbers -- tests/test_cuda_cudnn does that on a GPU.
 * Exit 77 (skip) where cuDNN 9.8+ or the stub is missing. */
#include "base/mal.h"
#include "kernels/cuda/cudnn.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifndef MAL_CUDA_DIR
#define MAL_CUDA_DIR "/usr/local/cuda"
#endif

int main(void)
{
#ifndef HAVE_CUDNN_H
    printf("SKIP: built without cuDNN's headers (cudnn_graph.h)\n");
    return 77;
#else
    /* an H100 80GB HBM3 (SXM, 132 SMs), as cuDNN's JSON form of a device */
    static const char *h100 =
        "{\"cudaDeviceId\":0,\"deviceVer\":900,\"driverVer\":13000,\"isTccDriver\":0,"
        "\"l2CacheSize\":52428800,\"maxCtasPerSM\":32,\"maxRegistersPerSM\":65536,"
        "\"maxSharedMemoryPerBlock\":49152,\"maxSharedMemoryPerBlockOptin\":232448,"
        "\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"memClockRateKHz\":2619000,"
        "\"multiProcessorCount\":132,\"pciDeviceId\":0,\"regsPerBlock\":65536,"
        "\"reservedSharedMemoryPerBlock\":1024,\"smClockRateKHz\":1980000,\"supportCoopLaunch\":1,"
        "\"totalGlobalMem\":85045510144,\"warpSize\":32,\"deviceName\":\"NVIDIA H100 80GB HBM3\","
        "\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64]}";
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) &&
        !dlopen(MAL_CUDA_DIR "/lib64/stubs/libcuda.so", RTLD_NOW | RTLD_GLOBAL)) {
        printf("SKIP: neither a driver's libcuda.so.1 nor %s/lib64/stubs/libcuda.so\n",
               MAL_CUDA_DIR);
        return 77;
    }
    static const struct {
        const char *name;
        int B, T, H, Hkv, hd;
    } shapes[] = {
        {"124m", 16, 1024, 12, 12, 64},
        {"1b", 8, 2048, 16, 16, 128},
        {"small", 2, 128, 4, 4, 64},
        {"gqa (group 4)", 2, 256, 8, 2, 128},
        {"llama3-1b (gqa)", 8, 2048, 32, 8, 64},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        mal_cu_heads hs = {shapes[i].H, shapes[i].Hkv, shapes[i].H / shapes[i].Hkv, 0};
        int fe = 0, be = 0;
        char msg[1024];
        if (mal_cudnn_check_offline(shapes[i].B, shapes[i].T, hs, shapes[i].hd, h100, &fe, &be, msg,
                                    sizeof msg)) {
            if (strstr(msg, "cannot load") || strstr(msg, "9.8 or later")) {
                printf("SKIP: %s\n", msg);
                return 77;
            }
            printf("FAIL %s: %s\n", shapes[i].name, msg);
            bad++;
            continue;
        }
        printf("%s %-16s B %d T %d H %d Hkv %d hd %d: forward %d, backward %d engine configs\n",
               fe > 0 && be > 0 ? "ok  " : "FAIL", shapes[i].name, shapes[i].B, shapes[i].T,
               shapes[i].H, shapes[i].Hkv, shapes[i].hd, fe, be);
        if (fe <= 0 || be <= 0) bad++;
    }
    return bad ? 1 : 0;
#endif
}
