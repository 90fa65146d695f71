/* Tensor pieces (piece.h): shapes and strided copies through the kernel
 * table. */
#include "piece.h"

#include "base/mal.h"

/* Local offset of the shard along the tensor's axis. */
static int64_t local_axis_off(const mal_tensor_info *t)
{
    return t->split_dim == t->axis && t->split_dim >= 0 ? t->split_off : 0;
}

size_t mal_piece_floats(const mal_tensor_info *t, int64_t begin, int64_t end)
{
    int64_t other = t->ndim == 2 ? t->local_shape[1 - t->axis] : 1;
    return (size_t)((end - begin) * other);
}

void mal_piece_locate(const mal_tensor_info *t, int64_t begin, int64_t end, mal_piece_shape *out)
{
    int64_t off = local_axis_off(t), b = begin - off, e = end - off;
    if (t->ndim == 1 || t->axis == 0) {
        /* whole rows: one run */
        int64_t cols = t->ndim == 2 ? t->local_shape[1] : 1;
        *out = (mal_piece_shape){t->offset + (size_t)(b * cols), 1, (e - b) * cols, (e - b) * cols};
        return;
    }
    int64_t rows = t->local_shape[0], cols = t->local_shape[1];
    if (e - b == cols) /* the whole width: one run */
        *out = (mal_piece_shape){t->offset, 1, rows * cols, rows * cols};
    else
        *out = (mal_piece_shape){t->offset + (size_t)b, rows, e - b, cols};
}

void mal_piece_pack_elems(mal_kern k, const mal_tensor_info *t, const void *base, size_t esz,
                          int64_t begin, int64_t end, void *dst, mal_copy_kind kind)
{
    mal_piece_shape s;
    mal_piece_locate(t, begin, end, &s);
    const size_t w = (size_t)s.width * esz;
    mal_kern_memcpy2d(k, dst, w, (const char *)base + s.offset * esz, (size_t)s.stride * esz, w,
                      (size_t)s.rows, kind);
}

void mal_piece_unpack_elems(mal_kern k, const mal_tensor_info *t, void *base, size_t esz,
                            int64_t begin, int64_t end, const void *src, mal_copy_kind kind)
{
    mal_piece_shape s;
    mal_piece_locate(t, begin, end, &s);
    const size_t w = (size_t)s.width * esz;
    mal_kern_memcpy2d(k, (char *)base + s.offset * esz, (size_t)s.stride * esz, src, w, w,
                      (size_t)s.rows, kind);
}

void mal_piece_pack(mal_kern k, const mal_tensor_info *t, const float *base, int64_t begin,
                    int64_t end, void *dst, mal_copy_kind kind)
{
    mal_piece_pack_elems(k, t, base, sizeof(float), begin, end, dst, kind);
}

void mal_piece_unpack(mal_kern k, const mal_tensor_info *t, float *base, int64_t begin, int64_t end,
                      const void *src, mal_copy_kind kind)
{
    mal_piece_unpack_elems(k, t, base, sizeof(float), begin, end, src, kind);
}

void mal_piece_copy(mal_kern k, float *to, const mal_piece_shape *b, const float *from,
                    const mal_piece_shape *a)
{
    /* A contiguous side is one run of rows x width; the strided side says
     * how many runs there are. */
    int64_t rows = MAL_MAX(a->rows, b->rows), width = a->rows > 1 ? a->width : b->width;
    size_t sp = (size_t)(a->rows > 1 ? a->stride : width) * sizeof(float);
    size_t dp = (size_t)(b->rows > 1 ? b->stride : width) * sizeof(float);
    mal_kern_memcpy2d(k, to + b->offset, dp, from + a->offset, sp, (size_t)width * sizeof(float),
                      (size_t)rows, MAL_COPY_D2D);
}
