/* test_tensor.c: dtype conversions, checked shape arithmetic, broadcasting. */
#include <criterion/criterion.h>
#include <math.h>

#include "test_util.h"

Test(tensor, half_round_trip_of_every_finite_half) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue; /* Inf/NaN checked below */
        float f = kf_half_to_float((uint16_t)h);
        cr_assert_eq(kf_float_to_half(f), h, "half 0x%04x -> %g -> 0x%04x", h, f, kf_float_to_half(f));
    }
    cr_assert(isinf(kf_half_to_float(0x7c00)));
    cr_assert(isnan(kf_half_to_float(kf_float_to_half(NAN))));
    cr_assert_eq(kf_float_to_half(1e6f), 0x7c00, "overflow goes to +Inf");
}

Test(tensor, bf16_rounds_to_nearest_even) {
    cr_assert_eq(kf_float_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 lies exactly between two bf16 values: ties go to even */
    cr_assert_eq(kf_float_to_bf16(1.00390625f), 0x3f80);
    cr_assert_eq(kf_float_to_bf16(1.01171875f), 0x3f82);
    cr_assert(isnan(kf_bf16_to_float(kf_float_to_bf16(NAN))));
}

Test(tensor, numel_rejects_overflow_and_negative_dims) {
    int64_t n;
    int64_t big[3] = {INT64_MAX / 2, 3, 1};
    cr_assert_eq(kf_shape_numel(3, big, 4, &n), KF_ERR_BAD_MODEL);
    int64_t neg[2] = {4, -1};
    cr_assert_eq(kf_shape_numel(2, neg, 4, &n), KF_ERR_BAD_MODEL);
    int64_t ok[2] = {3, 5};
    cr_assert_eq(kf_shape_numel(2, ok, 4, &n), KF_OK);
    cr_assert_eq(n, 15);
}

Test(tensor, set_saturates_instead_of_undefined_casts) {
    int64_t d[1] = {3};
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_INT8, 1, d), KF_OK);
    kf_set_f64(&t, 0, 1000.0);
    kf_set_f64(&t, 1, -1000.0);
    kf_set_f64(&t, 2, NAN);
    cr_assert_eq(kf_get_i64(&t, 0), 127);
    cr_assert_eq(kf_get_i64(&t, 1), -128);
    cr_assert_eq(kf_get_i64(&t, 2), 0);
    kf_tensor_release(&t);
}

Test(tensor, broadcast_offsets_follow_numpy) {
    int64_t da[2] = {2, 3}, db[1] = {3};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 2, da, -1, 1), b = tu_rand(KF_DT_FLOAT, 1, db, -1, 1);
    const kf_tensor *in[2] = {&a, &b};
    kf_node *n = tu_node("Add", 2, 1, 13);
    kf_bcast bc;
    cr_assert_eq(kf_bcast_init(&bc, n, 2, in), KF_OK);
    cr_assert_eq(bc.numel, 6);
    int64_t offs[2];
    kf_bcast_offsets(&bc, 4, offs); /* row 1, col 1 */
    cr_assert_eq(offs[0], 4);
    cr_assert_eq(offs[1], 1);
    int64_t dc[2] = {4, 3};
    kf_tensor c = tu_rand(KF_DT_FLOAT, 2, dc, -1, 1);
    const kf_tensor *bad[2] = {&a, &c};
    cr_assert_eq(kf_bcast_init(&bc, n, 2, bad), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "Add") != NULL, "message names the node: %s", kf_last_error());
    tu_node_free(n);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    kf_tensor_release(&c);
}
