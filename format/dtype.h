/*
 * dtype.h — the safetensors dtypes, their sizes, and exact float conversions.
 *
 * The enum order is the reference implementation's Dtype order; the writer
 * sorts tensors by it (descending) so our files match the reference writer's
 * byte for byte. Conversions between F64, F32, F16 and BF16 round to nearest,
 * ties to even; NaN stays NaN (quiet, sign kept); overflow gives infinity;
 * widening is exact.
 */
#ifndef CKPT_FORMAT_DTYPE_H
#define CKPT_FORMAT_DTYPE_H

#include "include/ckpt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ckpt_dtype (CKPT_DT_*, in the reference Dtype order) and CKPT_MAX_RANK (the
 * one rank limit: the reader, the store, states, and PLAN_MAX_DIM) are
 * defined once, in the public include/ckpt.h. The functions below that
 * ckpt.h also declares are the same functions, with the inside details. */

const char *ckpt_dtype_name(ckpt_dtype dt);
/* Parses "F32", "BF16", ...; also accepts lowercase "bf16", "f16", "f32", "f64". */
int ckpt_dtype_from_name(const char *s, ckpt_dtype *out);
/* Bits per element (4 for F4, 6 for F6_*, 8 for BOOL). */
unsigned ckpt_dtype_bits(ckpt_dtype dt);
/* Bytes per element for whole-byte dtypes, 0 for sub-byte ones. */
unsigned ckpt_dtype_size(ckpt_dtype dt);
/* F16, BF16, F32, F64: the dtypes cast() works between. */
bool ckpt_dtype_is_castable_float(ckpt_dtype dt);
/* Elements of a shape; false on overflow. */
bool ckpt_shape_numel(int ndim, const uint64_t *shape, uint64_t *out);
/* Bytes of dtype x shape. Errors (message only, no file name):
 * CKPT_ELIMIT "ValidationOverflow" when prod(shape)*bits overflows,
 * CKPT_EINVAL "MisalignedSlice" when it is not a whole number of bytes. */
int ckpt_dtype_nbytes(ckpt_dtype dt, int ndim, const uint64_t *shape, uint64_t *out);

/* Scalar conversions. */
uint16_t ckpt_f32_to_bf16(float f);
float ckpt_bf16_to_f32(uint16_t h);
uint16_t ckpt_f32_to_f16(float f);
float ckpt_f16_to_f32(uint16_t h);
float ckpt_f64_to_f32(double d);
/* F64 -> BF16/F16 round once, directly from double (no double rounding). */
uint16_t ckpt_f64_to_bf16(double d);
uint16_t ckpt_f64_to_f16(double d);

/* Converts n elements between castable float dtypes (src and dst must not
 * overlap; little-endian bytes, any alignment). Same dtype is a memcpy. */
void ckpt_convert(ckpt_dtype from, const void *src, ckpt_dtype to, void *dst, size_t n);
/* The value of one little-endian I32, I64, F32 or F64 element (a step or a
 * counter saved as a 0-d tensor) as a double; -1 for any other dtype. */
int ckpt_scalar_value(ckpt_dtype dt, const void *bytes, double *out);

/* "[2, 3, 4]" into buf (truncated with "..." when it does not fit); returns buf. */
const char *ckpt_shape_str(int ndim, const uint64_t *shape, char *buf, size_t len);

#endif
