/*
 * ops_elementwise.h: what the elementwise family's files share (the
 * broadcasting kernel in ops_elementwise.c, the conversions of Cast in
 * ops_elementwise_cast.c). Internal to graph/.
 */
#ifndef KF_OPS_ELEMENTWISE_H
#define KF_OPS_ELEMENTWISE_H

#include "kf_ref.h"

/* Stores v into element i of a float or integer tensor, rounding once:
 * double -> float16/bfloat16 goes through a round-to-odd float, so the
 * result is the nearest-even value of v itself (kf_set_f64 rounds twice).
 * Other dtypes behave as kf_set_f64. */
void kf_ew_store_f64(kf_tensor *t, int64_t i, double v);
/* The float16 (dt KF_DT_FLOAT16) or bfloat16 bits nearest to v. */
uint16_t kf_ew_narrow16(double v, kf_dtype dt);

/* Opset version a node runs at; a node without one runs the latest. */
int64_t kf_ew_version(const kf_node *n);

#endif
