# MAL_CHECK_CUDA / MAL_CHECK_NCCL: optional CUDA toolkit + cuBLAS, and NCCL.
#
# --with-cuda[=DIR]  (default: check /usr/local/cuda; use it when complete)
# --with-nccl[=DIR]  (default: check the CUDA dir; use it when found)
# Explicit --with-X (or =DIR) that cannot be satisfied is an error; the
# default only reports what it found.  Defines HAVE_CUDA / HAVE_NCCL, the
# automake conditionals of the same names, NVCC, CUDA_CFLAGS, CUDA_LIBS,
# NCCL_CFLAGS, NCCL_LIBS, NVCC_ARCH_FLAGS.  With CUDA, HAVE_CUDNN_H when
# cuDNN's cudnn_graph.h compiles with CUDNN_CFLAGS (added to CUDA_CFLAGS).

AC_DEFUN([MAL_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
       [use the CUDA toolkit and cuBLAS in DIR (default: /usr/local/cuda if present)])],
    [], [with_cuda=check])
  AC_ARG_VAR([NVCC_ARCH_FLAGS], [nvcc -gencode flags (default: sm_90a and sm_80 machine code plus compute_90 PTX)])
  AC_ARG_VAR([CUDNN_CFLAGS], [preprocessor flags for cuDNN's headers (cudnn_graph.h), default: the CUDA include dir])
  mal_have_cuda=no
  mal_cuda_summary="no"
  mal_have_cudnn_h=no
  mal_cudnn_summary="no (needs CUDA)"
  AS_CASE([$with_cuda],
    [no], [mal_cuda_summary="disabled (--without-cuda)"],
    [yes|check], [mal_cuda_dir=/usr/local/cuda],
    [mal_cuda_dir=$with_cuda])
  AS_IF([test "x$with_cuda" != xno], [
    mal_cuda_why=""
    AC_MSG_CHECKING([for nvcc in $mal_cuda_dir/bin])
    AS_IF([test -x "$mal_cuda_dir/bin/nvcc"],
          [NVCC="$mal_cuda_dir/bin/nvcc"; AC_MSG_RESULT([yes])],
          [AC_MSG_RESULT([no]); mal_cuda_why="no nvcc in $mal_cuda_dir/bin"])
    AS_IF([test -z "$mal_cuda_why"], [
      mal_cuda_libdir="$mal_cuda_dir/lib64"
      AS_IF([test -d "$mal_cuda_libdir"], [], [mal_cuda_libdir="$mal_cuda_dir/lib"])
      save_CPPFLAGS=$CPPFLAGS; save_LIBS=$LIBS; save_LDFLAGS=$LDFLAGS
      CPPFLAGS="$CPPFLAGS -I$mal_cuda_dir/include"
      LDFLAGS="$LDFLAGS -L$mal_cuda_libdir"
      LIBS="-lcublasLt -lcublas -lcudart $LIBS"
      AC_MSG_CHECKING([whether CUDA runtime, cuBLAS and cuBLASLt link])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>]], [[int n; cublasHandle_t h; cublasLtHandle_t lt; cudaGetDeviceCount(&n); cublasCreate(&h); cublasLtCreate(&lt);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); mal_cuda_why="cuda_runtime.h/cublas_v2.h/cublasLt.h or libcudart/libcublas/libcublasLt unusable in $mal_cuda_dir"])
      CPPFLAGS=$save_CPPFLAGS; LIBS=$save_LIBS; LDFLAGS=$save_LDFLAGS
    ])
    AS_IF([test -z "$mal_cuda_why"], [
      mal_have_cuda=yes
      CUDA_DIR="$mal_cuda_dir"
      dnl -isystem: the toolkit's headers are not ours to keep warning-free
      CUDA_CFLAGS="-isystem $mal_cuda_dir/include"
      CUDA_LIBS="-L$mal_cuda_libdir -Wl,-rpath,$mal_cuda_libdir -lcublasLt -lcublas -lcudart -lstdc++"
      dnl sm_90a: Hopper's own instructions (HOPPER.md: the -gencode form);
      dnl sm_80: Ampere; compute_90 PTX: the driver compiles it for later GPUs
      AS_IF([test -z "$NVCC_ARCH_FLAGS"],
            [NVCC_ARCH_FLAGS="-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=compute_90"])
      mal_cuda_summary="yes ($mal_cuda_dir)"
      AC_DEFINE([HAVE_CUDA], [1], [Define if the CUDA toolkit and cuBLAS are used.])
      dnl cuDNN's fused attention (kernels/cuda/cudnn.c): only its headers at
      dnl build time; the library is dlopen'ed at run time, so -ldl and no
      dnl -lcudnn: a build without cuDNN installed still runs everywhere
      CUDA_LIBS="$CUDA_LIBS -ldl"
      mal_cudnn_summary="no (cudnn_graph.h not found: set CUDNN_CFLAGS)"
      AC_MSG_CHECKING([for cuDNN's cudnn_graph.h])
      save_CPPFLAGS=$CPPFLAGS
      CPPFLAGS="$CPPFLAGS $CUDA_CFLAGS $CUDNN_CFLAGS"
      AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <cudnn_graph.h>]],
                                         [[cudnnBackendDescriptor_t d = 0; (void)d;]])],
        [AC_MSG_RESULT([yes])
         mal_have_cudnn_h=yes
         AS_IF([test -n "$CUDNN_CFLAGS"], [CUDA_CFLAGS="$CUDA_CFLAGS $CUDNN_CFLAGS"])
         mal_cudnn_summary="headers yes (libcudnn.so.9 loaded at run time)"
         AC_DEFINE([HAVE_CUDNN_H], [1],
                   [Define if cuDNN's headers are found (the library is loaded at run time).])],
        [AC_MSG_RESULT([no])])
      CPPFLAGS=$save_CPPFLAGS
    ], [
      AS_IF([test "x$with_cuda" != xcheck],
            [AC_MSG_ERROR([--with-cuda was given but CUDA is not usable: $mal_cuda_why])])
      mal_cuda_summary="no ($mal_cuda_why)"
    ])
  ])
  AC_SUBST([NVCC]) AC_SUBST([CUDA_DIR]) AC_SUBST([CUDA_CFLAGS]) AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC_ARCH_FLAGS])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$mal_have_cuda" = xyes])
])

AC_DEFUN([MAL_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
       [use NCCL from DIR (default: the CUDA directory, if CUDA is used)])],
    [], [with_nccl=check])
  mal_have_nccl=no
  mal_nccl_summary="no"
  AS_CASE([$with_nccl],
    [no], [mal_nccl_summary="disabled (--without-nccl)"],
    [yes|check], [mal_nccl_dir="$CUDA_DIR"],
    [mal_nccl_dir=$with_nccl])
  AS_IF([test "x$with_nccl" != xno], [
    mal_nccl_why=""
    AS_IF([test "x$mal_have_cuda" != xyes], [mal_nccl_why="needs CUDA"])
    AS_IF([test -z "$mal_nccl_why"], [
      mal_nccl_libdir="$mal_nccl_dir/lib64"
      AS_IF([test -d "$mal_nccl_libdir"], [], [mal_nccl_libdir="$mal_nccl_dir/lib"])
      save_CPPFLAGS=$CPPFLAGS; save_LIBS=$LIBS; save_LDFLAGS=$LDFLAGS
      CPPFLAGS="$CPPFLAGS -I$mal_nccl_dir/include $CUDA_CFLAGS"
      LDFLAGS="$LDFLAGS -L$mal_nccl_libdir"
      LIBS="-lnccl $CUDA_LIBS $LIBS"
      AC_MSG_CHECKING([whether NCCL links])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[ncclUniqueId id; ncclGetUniqueId(&id);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); mal_nccl_why="nccl.h or libnccl unusable in $mal_nccl_dir"])
      CPPFLAGS=$save_CPPFLAGS; LIBS=$save_LIBS; LDFLAGS=$save_LDFLAGS
    ])
    AS_IF([test -z "$mal_nccl_why"], [
      mal_have_nccl=yes
      NCCL_CFLAGS="-I$mal_nccl_dir/include"
      NCCL_LIBS="-L$mal_nccl_libdir -Wl,-rpath,$mal_nccl_libdir -lnccl"
      mal_nccl_summary="yes ($mal_nccl_dir)"
      AC_DEFINE([HAVE_NCCL], [1], [Define if NCCL is used.])
    ], [
      AS_IF([test "x$with_nccl" != xcheck],
            [AC_MSG_ERROR([--with-nccl was given but NCCL is not usable: $mal_nccl_why])])
      mal_nccl_summary="no ($mal_nccl_why)"
    ])
  ])
  AC_SUBST([NCCL_CFLAGS]) AC_SUBST([NCCL_LIBS])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$mal_have_nccl" = xyes])
])
