/*
 * test_hostile.c - what a careless or hostile caller may pass: sizes at the
 * edges of int32 and int64, views that would point outside their memory,
 * counts that would overflow. Every such call must fail with a status and a
 * message naming the field, and change nothing; nothing may crash or write
 * outside the memory the call was given.
 */
#include "harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- plan(): block counts and totals near INT32_MAX ------------------------ */

/* plan() of one request with q_len 1 and the given kv_len on backend `name`,
 * page 16, a block table of `stride` entries (every id 0); returns the status,
 * the message in msg. */
static ak_status plan_one(const test_ctx *t, const char *name, int32_t kv_len, int stride, int max_blocks,
                          char *msg, size_t cap)
{
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = 4;
    cfg.num_kv_heads = 2;
    cfg.head_dim_qk = cfg.head_dim_vo = 64;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = t->device.kind == AK_DEVICE_CUDA ? AK_BF16 : AK_F32;
    cfg.device = t->device;
    cfg.page_size = 16;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = 1;
    lim.max_tokens = 1;
    lim.max_blocks_per_req = max_blocks;
    lim.num_cache_blocks = 4;
    ak_backend *b = NULL;
    msg[0] = '\0';
    ak_status st = ak_backend_create(&cfg, &lim, name, &b);
    if (st == AK_OK) {
        int32_t *bt = calloc((size_t)stride, sizeof(int32_t));
        const int32_t qo[2] = {0, 1};
        ak_batch batch;
        ak_batch_init(&batch);
        batch.num_reqs = 1;
        batch.qo_indptr = qo;
        batch.kv_lens = &kv_len;
        batch.block_table = bt;
        batch.block_table_stride = stride;
        st = ak_backend_plan(b, &batch, NULL);
        free(bt);
    }
    snprintf(msg, cap, "%s", ak_last_error());
    ak_backend_destroy(b);
    return st;
}

/* kv_len + page_size - 1 above INT32_MAX wrapped the block count negative
 * past every check, and the metadata copy then crashed. */
static void hostile_huge_kv_len(test_ctx *t, const char *name)
{
    static const int32_t lens[] = {INT32_MAX, INT32_MAX - 14, INT32_MAX - 15};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
        for (int wide = 0; wide < 2; wide++) {
            char case_name[96], msg[4096];
            snprintf(case_name, sizeof case_name, "plan kv_len %d, block_table_stride %s", lens[i],
                     wide ? "2048" : "1");
            if (!t_selected(t, case_name)) continue;
            /* a table of 1 or 2048 entries: too short either way, for 2^27 blocks */
            const ak_status st = plan_one(t, name, lens[i], wide ? 2048 : 1, 2048, msg, sizeof msg);
            const ak_status want = AK_ERR_INVALID_ARG;
            const char *field = "batch.kv_lens[0]";
            char blocks[32];
            snprintf(blocks, sizeof blocks, "needs %lld blocks", ((long long)lens[i] + 15) / 16);
            if (st == want && strstr(msg, field) && strstr(msg, blocks))
                t_pass(t, name, case_name, "%s", msg);
            else
                t_fail(t, name, case_name, "status %s (want %s), message \"%s\" (want %s, %s)",
                       ak_status_str(st), ak_status_str(want), msg, field, blocks);
        }
}

/* ---- the case table: configs at the edges of int32 --------------------------- */

#define NHD AK_LAYOUT_NHD
#define PAGED AK_KV_PAGED

/* name, Hq, Hkv, Dqk, Dvo, dtype, o_dtype(unused), o_f32, causal, window, cap,
 * page, layout, storage, num_reqs, {q_len, kv_len}... */
static const attn_case edge_cases[] = {
    /* non-causal queries past their keys sit at negative positions p, and
     * p - window_left overflowed int: the rows then saw no key */
    {"window INT32_MAX, non-causal q_len > kv_len", 4, 2, 64, 64, AK_F32, 0, 0, 0, INT32_MAX, 0, 16, NHD, PAGED, 3,
     {{5, 2}, {1, 3}, {3, 0}}},
    {"window INT32_MAX, non-causal q_len > kv_len bf16", 8, 2, 128, 128, AK_BF16, 0, 0, 0, INT32_MAX, 0, 16, NHD,
     PAGED, 3, {{40, 7}, {1, 3}, {70, 100}}},
    {"window INT32_MAX - 1, causal", 4, 2, 64, 64, AK_F16, 0, 0, 1, INT32_MAX - 1, 0, 16, NHD, PAGED, 2,
     {{1, 40}, {20, 20}}},
};

void test_hostile(test_ctx *t)
{
    for (size_t i = 0; i < sizeof edge_cases / sizeof *edge_cases; i++) run_case(t, &edge_cases[i]);

    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++) hostile_huge_kv_len(t, names[i]);
}
