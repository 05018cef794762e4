/* fastadam/yardstick.h -- the benchmarks' memory-bandwidth yardstick (contract in yardstick.c). */
#ifndef FASTADAM_YARDSTICK_H
#define FASTADAM_YARDSTICK_H

#include "fastadam/common.h"

void fa_stream_rw_f32(float *a, const float *d, float *b, float *c, ptrdiff_t n);
void fa_stream_rw2_f32(float *a, const float *d, float *b, ptrdiff_t n);
int fa_stream_rw_bits(void *x, int xw, const void *g, int gw, void *a, void *b, int sw,
                      ptrdiff_t n);

#endif /* FASTADAM_YARDSTICK_H */
