/* test_validate.c — the validator (region/validate.c) is the compiler's
 * own invariant, not only the cache decoder's: every program and region
 * regc compiles passes it, the offloaded update's included, a LoRA base
 * sharded under ZeRO-3 among them; attention's dropout operands out of
 * their rule are refused, and each kernel's rule honours a bf16 mark only
 * where the kernel can. (Entries written by someone else are
 * tests/test_cache_hostile.c's.) */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_train.h"
#include "serial.h"
#include "test_cache_util.h"
#include "test_model.h"
#include "test_util.h"
#include "validate.h"

static int setup(void **state) { return regc_test_dir_setup(state, "validate", "cache"); }

/* The validator accepts every program and region the compiler makes: it
 * is the compiler's own invariant, not only the decoder's. */
static void test_compiled_programs_validate(void **state)
{
    (void)state;
    static const struct {
        const char *preset;
        regc_level level;
        int inline_back, regional;
        int ranks, stage; /* several ranks: their collectives, scheduled */
        int offload;      /* the optimizer's state and update on the host */
    } cases[] = {
        {"gpt2-tiny", REGC_LEVEL_O0, 1, 1, 1, 0, 0},  {"gpt2-tiny", REGC_LEVEL_O1, 1, 1, 1, 0, 0},
        {"gpt2-tiny", REGC_LEVEL_O1, 0, 1, 1, 0, 0},  {"gpt2-tiny", REGC_LEVEL_O2, 1, 0, 1, 0, 0},
        {"llama-tiny", REGC_LEVEL_O1, 1, 1, 1, 0, 0}, {"llama-tiny", REGC_LEVEL_O0, 1, 1, 1, 0, 0},
        {"bert-tiny", REGC_LEVEL_O2, 1, 1, 1, 0, 0},  {"t5-tiny", REGC_LEVEL_O1, 1, 1, 1, 0, 0},
        {"t5-tiny", REGC_LEVEL_O1, 0, 1, 1, 0, 0},    {"gpt2-tiny", REGC_LEVEL_O1, 1, 1, 2, 0, 0},
        {"llama-tiny", REGC_LEVEL_O1, 1, 1, 2, 3, 0}, {"t5-tiny", REGC_LEVEL_O1, 1, 0, 4, 3, 0},
        {"bert-tiny", REGC_LEVEL_O0, 1, 1, 2, 3, 0},  {"gpt2-tiny", REGC_LEVEL_O1, 0, 1, 2, 0, 0},
        {"gpt2-tiny", REGC_LEVEL_O1, 0, 1, 2, 0, 1},  {"llama-tiny", REGC_LEVEL_O1, 1, 1, 2, 3, 1},
        {"t5-tiny", REGC_LEVEL_O0, 1, 1, 1, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load_shapes(cases[i].preset, &m), REGC_OK);
        for (int fwd = 0; fwd < 2; fwd++) {
            regc_compile_options o;
            regc_compile_options_default(&o);
            o.level = cases[i].level;
            o.inline_back = cases[i].inline_back;
            o.regional = cases[i].regional;
            o.forward_only = fwd;
            o.ranks = cases[i].ranks, o.zero_stage = cases[i].stage;
            o.offload_optimizer = cases[i].offload;
            o.reduce_bucket_floats = 5000; /* several buckets, several reduce-scatters in flight */
            regc_program *p = NULL;
            regc_compile_stats st;
            assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, &st), REGC_OK);
            for (int r = 0; r < p->n_regions; r++)
                if (regc_region_validate(p->regions[r]) != REGC_OK)
                    fail_msg("case %zu: %s", i, regc_error_message());
            if (regc_program_validate(p) != REGC_OK)
                fail_msg("case %zu (forward only %d): %s", i, fwd, regc_error_message());
            regc_program_free(p);
        }
        regc_model_free(m);
    }
}

/* An offloaded update's operands are where the host can touch them: AdamW
 * given the device's gradients, or a copy back to the host given device
 * memory, is refused (on a GPU a host kernel would fault on it). */
static void test_offloaded_update_stays_on_the_host(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.offload_optimizer = 1;
    for (int change = 0; change < 3; change++) {
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, NULL), REGC_OK);
        assert_int_equal(regc_program_validate(p), REGC_OK);
        int adamw = -1, d2h = -1, device_grads = -1;
        for (int i = 0; i < p->n_update; i++) {
            adamw = p->update[i].kernel == K_ADAMW ? i : adamw;
            d2h = p->update[i].kernel == K_COPY_D2H && d2h < 0 ? i : d2h;
        }
        assert_true(adamw >= 0 && d2h >= 0);
        device_grads = p->update[d2h].refs[1].buf; /* what the copy reads: the device's */
        if (change == 0)
            p->update[adamw].refs[3].buf = device_grads;
        else if (change == 1)
            p->update[d2h].refs[0].buf = device_grads;
        else
            p->offload = 0; /* host buffers in a program that keeps its update on the device */
        assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
        assert_non_null(strstr(regc_error_message(), "host memory"));
        regc_program_free(p);
    }
    regc_model_free(m);
}

/* A LoRA model at ZeRO-3 over 2 ranks, its base in bf16 and in NF4: the
 * programs validate, the frozen block a shard of the frozen layout; a
 * frozen block of any other size is refused. */
static void test_frozen_shards_validate(void **state)
{
    (void)state;
    for (int nf4 = 0; nf4 < 2; nf4++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load_shapes("llama-tiny", &m), REGC_OK);
        regc_lora_config c = {.r = 4,
                              .target_modules = "all-linear",
                              .base_dtype = nf4 ? REGC_BASE_FP32 : REGC_BASE_BF16,
                              .load_in_4bit = nf4};
        assert_int_equal(regc_model_add_lora(m, &c), REGC_OK);
        regc_compile_options o;
        regc_compile_options_default(&o);
        o.ranks = 2, o.zero_stage = 3;
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, NULL), REGC_OK);
        assert_non_null(p->frozen_layout);
        assert_int_equal(p->frozen_bytes, p->frozen_layout->shard_floats * 4);
        assert_int_equal(regc_program_validate(p), REGC_OK);
        p->frozen_bytes += 64;
        assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
        assert_non_null(strstr(regc_error_message(), "a frozen block of"));
        regc_program_free(p);
        regc_model_free(m);
    }
}

/* Attention's dropout in a program: its p in [0, 1), its site and draw
 * given exactly when it drops; otherwise refused. */
static void test_attention_dropout_operands(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    regc_model_set_dropout(m, 1);
    regc_compile_options o;
    regc_compile_options_default(&o);
    regc_program *p = NULL;
    assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, NULL), REGC_OK);
    assert_int_equal(regc_program_validate(p), REGC_OK);
    regc_instr *attn = NULL;
    for (int i = 0; i < p->n_instr && !attn; i++)
        attn = p->instr[i].kernel == K_ATTN_FWD ? &p->instr[i] : NULL;
    assert_non_null(attn);
    assert_true(attn->f > 0.0f && attn->refs[6].buf >= 0 && attn->refs[7].buf >= 0);
    const float p_drop = attn->f;
    attn->f = 0.0f;
    assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "a dropout's site or draw given to an attention"));
    attn->f = 1.5f;
    assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "attention's dropout p is outside [0, 1)"));
    attn->f = p_drop;
    assert_int_equal(regc_program_validate(p), REGC_OK);
    regc_program_free(p);
    regc_model_free(m);
}

/* A rope's rotated part (d5): even, 2 or more, within the head (d3); the
 * tables it reads are [t, d5 / 2]. */
static void test_rope_rotated_part(void **state)
{
    (void)state;
    regc_compile_options o;
    regc_compile_options_default(&o);
    regc_program *p = regc_test_compile("llama-tiny", 2, 16, &o, NULL);
    regc_instr *rope = NULL;
    for (int i = 0; i < p->n_instr && !rope; i++)
        rope = p->instr[i].kernel == K_ROPE ? &p->instr[i] : NULL;
    assert_non_null(rope);
    assert_int_equal(rope->d[5], rope->d[3]); /* Llama turns the whole head */
    const int64_t rot = rope->d[5];
    const int64_t bad[] = {0, 3, -2, rot + 2};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        rope->d[5] = bad[k];
        assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
        assert_non_null(strstr(regc_error_message(), "inconsistent rotary shape"));
    }
    rope->d[5] = rot - 2; /* a part of the head: its tables are read less far */
    assert_int_equal(regc_program_validate(p), REGC_OK);
    rope->d[5] = rot;
    assert_int_equal(regc_program_validate(p), REGC_OK);
    regc_program_free(p);
}

/* The rule of each kernel honours a bf16 mark only where the kernel can:
 * an all-gather in bf16 spans half the bytes and moves an even count (its
 * values travel in pairs); a GEMM's C in bf16 cannot accumulate. */
static void test_bf16_marks_in_the_rules(void **state)
{
    (void)state;
    regc_instr_extent e;
    regc_instr gather = {.kernel = K_ALLGATHER,
                         .n_refs = 2,
                         .n_out = 1,
                         .bf16_refs = 1,
                         .refs = {{0, 0}, {1, 0}},
                         .d = {32}};
    assert_int_equal(regc_instr_extent_of(&gather, 2, &e), REGC_OK);
    assert_int_equal(e.bytes[0], 2 * 32 * 2); /* 2 ranks x 32 values x 2 bytes */
    assert_int_equal(e.bytes[1], 32 * 4);     /* this rank's fp32 shard */
    gather.d[0] = 33;
    assert_int_equal(regc_instr_extent_of(&gather, 2, &e), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "odd count"));
    regc_instr gemm = {.kernel = K_GEMM,
                       .n_refs = 6,
                       .n_out = 1,
                       .bf16 = 1,
                       .accumulate = 1,
                       .bf16_refs = 1,
                       .refs = {{0, 0}, {1, 0}, {2, 0}, {-1, 0}, {-1, 0}, {-1, 0}},
                       .d = {4, 4, 4, 4, 4}};
    assert_int_equal(regc_instr_extent_of(&gemm, 1, &e), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "held in bf16"));
    gemm.accumulate = 0;
    assert_int_equal(regc_instr_extent_of(&gemm, 1, &e), REGC_OK);
    assert_int_equal(e.bytes[0], 4 * 4 * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_compiled_programs_validate, setup),
        regc_test_in_dir(test_offloaded_update_stays_on_the_host, setup),
        cmocka_unit_test(test_frozen_shards_validate),
        cmocka_unit_test(test_attention_dropout_operands),
        cmocka_unit_test(test_rope_rotated_part),
        cmocka_unit_test(test_bf16_marks_in_the_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
