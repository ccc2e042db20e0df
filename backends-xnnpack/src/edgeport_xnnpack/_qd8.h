/* Shared between _qd8.c (Python API, row quantization, qd8 x qc8w) and _qd8_b4.c (qd8 x qb4w on a packed filter). */
#ifndef EDGEPORT_QD8_H
#define EDGEPORT_QD8_H
#include <stddef.h>
#include <stdint.h>

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };

/* The packed 4-bit filter: output columns in blocks of B4_COLS; a block holds, in order,
 *   weights  [k / 8][64 bytes]: per 8 input channels, 4 bytes per column; byte t of column c holds channel 8i + t in
 *            its low nibble and channel 8i + 4 + t in its high nibble (unsigned nibbles, value + 8)
 *   nibsum   [k / group][B4_COLS] uint16: the sum of the column's nibbles over the group
 *   scales   [k / group][B4_COLS] float32
 * then zero padding to a multiple of 64 bytes. Padded columns (n not a multiple of B4_COLS) are all zero. */
#define B4_COLS 16

struct b4job {
    const int8_t *q;       /* [m][k] the rows quantized (int8, q = a + zero point) */
    const int32_t *kc;     /* [m][k / group] 8 * (zero_point * group - sum of q over the group) */
    const int32_t *nzp;    /* [m] -zero_point in the low 16 bits, 0 in the high 16 bits */
    const float *rscale;   /* [m] 1 / inv */
    const uint8_t *p;      /* the packed filter */
    const float *bias;     /* [n] or NULL */
    float *out;            /* [m][n] */
    ptrdiff_t m, k, n, group, block_bytes, blocks_per_task;
    int isa;
    float lo, hi;
};

size_t b4_block_bytes(ptrdiff_t k, ptrdiff_t group);
/* w: [n][k / 2] bytes (value + 8, the even input channel in the low nibble); scales [n][k / group]; p: n rounded up
 * to B4_COLS, times b4_block_bytes / B4_COLS bytes */
void b4_pack(const uint8_t *w, const float *scales, ptrdiff_t n, ptrdiff_t k, ptrdiff_t group, uint8_t *p);
/* task t: column blocks t * blocks_per_task ... (a pthreadpool task function) */
void b4_task(void *ctx, size_t task);

#endif
