/* Tensor pieces: where a range of a tensor lies in a rank's state buffer,
 * and moving it - packed into or out of a contiguous buffer, or from one
 * part's buffer into another's - through the kernel table's strided copy.
 *
 * A piece is the elements of global axis range [begin, end) of a tensor
 * (along the axis TP splits it, mal_tensor_info.axis), every other
 * coordinate whole, held in the local shard `t` of a model part.  In the
 * shard's row-major buffer it is `rows` runs of `width` floats, `stride`
 * floats apart (one run when contiguous: rows of a row-split tensor, or a
 * column range that is the shard's whole width); packed, it is the same
 * elements back to back in row-major order.  Gradient sync, snapshots and
 * online migration move state only as pieces, so the one strided copy of
 * the kernel table moves every byte whether the buffers live in host or in
 * device memory.
 *
 * Core layer: depends on the model's tensor table and the kernel table. */
#ifndef MAL_PIECE_H
#define MAL_PIECE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "model.h"

/* Where a piece lies in the shard's buffer (in floats). */
typedef struct {
    size_t offset;               /* the first element, from the buffer's start */
    int64_t rows, width, stride; /* runs, floats per run, floats between run starts */
} mal_piece_shape;

/* Local.  The shape of piece [begin, end) of shard t (global axis
 * coordinates inside the shard's range). */
void mal_piece_locate(const mal_tensor_info *t, int64_t begin, int64_t end, mal_piece_shape *out);

/* Local.  Floats in piece [begin, end) of t. */
size_t mal_piece_floats(const mal_tensor_info *t, int64_t begin, int64_t end);

/* Local.  Queue the copy of piece [begin, end) of shard t in state buffer
 * `base` (a device buffer of k holding the part's state) into the packed
 * buffer `dst`: a device buffer of k (MAL_COPY_D2D) or host memory
 * (MAL_COPY_D2H; valid after the queue has passed the copy). */
void mal_piece_pack(mal_kern k, const mal_tensor_info *t, const float *base, int64_t begin,
                    int64_t end, void *dst, mal_copy_kind kind);

/* Local.  The reverse: packed `src` (device buffer for MAL_COPY_D2D, host
 * memory for MAL_COPY_H2D) into piece [begin, end) of t in `base`. */
void mal_piece_unpack(mal_kern k, const mal_tensor_info *t, float *base, int64_t begin, int64_t end,
                      const void *src, mal_copy_kind kind);

/* Local.  The same for a buffer of elements of `esz` bytes laid out like
 * the state (the working weights in the compute dtype): packed elements
 * of esz bytes. */
void mal_piece_pack_elems(mal_kern k, const mal_tensor_info *t, const void *base, size_t esz,
                          int64_t begin, int64_t end, void *dst, mal_copy_kind kind);
void mal_piece_unpack_elems(mal_kern k, const mal_tensor_info *t, void *base, size_t esz,
                            int64_t begin, int64_t end, const void *src, mal_copy_kind kind);

/* Local.  Queue the copy of one piece from buffer `from` laid out as `a`
 * into buffer `to` laid out as `b` (device to device; a and b describe the
 * same elements, rows x width, with either side strided). */
void mal_piece_copy(mal_kern k, float *to, const mal_piece_shape *b, const float *from,
                    const mal_piece_shape *a);

#endif /* MAL_PIECE_H */
