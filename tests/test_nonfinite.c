#define _POSIX_C_SOURCE 200809L /* setenv */
/*
 * test_nonfinite.c - the rule of attnkit.h for NaN and infinities, on every
 * backend of the device under test: a NaN or an infinity in q, or in the K or
 * V row of a key a query row sees, makes that row's o (every element) and lse
 * NaN; keys a row does not see never affect it, whatever they hold; a row
 * that sees no key is o = 0, lse = -inf. And ak_merge_states: a NaN lse, or a
 * NaN or infinity in a non-empty state's v, in any position, makes the row
 * NaN.
 *
 * Each case builds a clean scene, takes the dense formula of the clean data
 * as the reference, writes one non-finite element into the device copy of q
 * or the cache, and runs the backend (decode and prefill batches, and long
 * requests the cpu backend splits over 4 threads' chunks). Rows the element
 * reaches must be NaN; every other row must match the reference; o is
 * poisoned with a finite sentinel, so an unwritten element shows. On the
 * CPU the cases run on fp8 K/V too (per-head scales): a NaN, +inf or -inf
 * written there is the NaN code (an infinity is never stored as 448).
 */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define Q_ROW_PAD 8       /* scene_build pads q's head rows by this many elements */
#define SENTINEL 12345.0f /* o's poison: finite in every dtype, never an attention output */

/* IN_K_SCALE / IN_V_SCALE: KV head `head`'s fp8 scale (fp8 runs only). */
typedef enum target { IN_Q, IN_K, IN_V, IN_K_SCALE, IN_V_SCALE } target;

/* One non-finite element and where it goes. In q: token `tok`, head `head`;
 * in K or V: request `req`, key `key`, KV head `head`. q_sign, in K: q's
 * element `dim` of every token and query head of KV head `head` given this
 * sign first (and the reference computed from that q), so that an infinity
 * of that sign in K turns every product with it to +inf and one of the
 * other to -inf: with -inf, no row that sees the key shows it in its
 * softmax (P 0), the case the CUDA prefill's unchecked path finds only
 * from its last token's products (attn.cuh). In q (paged K only): K's
 * element `dim` of every key of q's KV head given this sign, so that an
 * infinity in q makes every product of its row an infinity of one sign:
 * with -inf, P is 0 at every key and the row's max stays -inf, as for a
 * row that sees no key */
typedef struct corruption {
    target where;
    float value;
    int req, key, tok, head, dim;
    int q_sign;
} corruption;

typedef struct nf_case {
    const char *name;
    attn_case shape;  /* name unused */
    corruption bad;
    int threads;      /* AK_NUM_THREADS at create (0: as set) */
    int gpu_only;     /* a case about the CUDA kernels' grid alone (on the CPU a long case like another) */
} nf_case;

#define NHD AK_LAYOUT_NHD
#define PAGED AK_KV_PAGED
#define DEC(...) {NULL, 8, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, __VA_ARGS__}
#define WIN(w, ...) {NULL, 8, 2, 64, 64, AK_F32, 0, 0, 1, w, 0, 16, NHD, PAGED, __VA_ARGS__}
#define DIMS(qk, vo, ...) {NULL, 8, 2, qk, vo, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, __VA_ARGS__}

/* decode: three requests, the last long enough to split; prefill: a prompt,
 * a chunk on a prefix, a decode; split: a chunk on a long prefix. */
#define DECODE_BATCH DEC(3, {{1, 40}, {1, 300}, {1, 2100}})
#define PREFILL_BATCH DEC(3, {{40, 40}, {20, 100}, {1, 30}})
#define SPLIT_BATCH DEC(2, {{8, 3000}, {1, 17}})
/* 28/4 heads (qwen2.5-7b) at d128 on pages of 128: the Hopper prefill
 * packs each warpgroup's rows with 9 tokens x 7 heads, q and o by TMA */
#define GQA7_BATCH {NULL, 28, 4, 128, 128, AK_F32, 0, 0, 1, -1, 0, 128, NHD, PAGED, 2, {{40, 40}, {30, 200}}}
/* MHA at d128: the Hopper prefill's warpgroup 0 holds tokens 0-63 of a
 * 128-token row tile, whose rows see only the first half of the diagonal
 * key tile; a chunk whose keys end 44 keys into their last tile */
#define MHA128_BATCH {NULL, 4, 4, 128, 128, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2, {{128, 128}, {40, 300}}}
/* 32/8 heads (llama3-8b's group of 4) at d128, a prompt of 256 tokens
 * (1,024 rows: under the scan pass's threshold, so checked without marks):
 * the Hopper prefill's items of 32 tokens whose last key tile [0, 128)
 * the request's later keys fill are copied whole by TMA, keys past the
 * item's kv_end included; pages of 128 (a tile a box) and of 16 (page
 * boxes) */
#define GQA4_BATCH(page) {NULL, 32, 8, 128, 128, AK_F32, 0, 0, 1, -1, 0, page, NHD, PAGED, 1, {{256, 256}}}
/* long: MQA 16/1, so that q_len x group passes the scan pass's threshold (2048 rows)
 * at a cost the CPU oracle runs in a moment */
#define MQA16(w, ...) {NULL, 16, 1, 64, 64, AK_F32, 0, 0, 1, w, 0, 16, NHD, PAGED, __VA_ARGS__}
#define LONG_BATCH MQA16(-1, 2, {{260, 260}, {256, 700}})
/* the same at DP 256 (d256, d192/128), where the CUDA engine runs the
 * clean requests' items in a kernel of their own beside the checked ones */
#define LONG_DIMS(qk, vo) {NULL, 16, 1, qk, vo, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2, {{260, 260}, {256, 300}}}
/* the same at d128 on pages of 128 and of 64 (the Hopper prefill's TMA
 * boxes of a tile and of half of one): a request's last key tile runs past
 * kv_len, into slots of its last page that hold no key (a NaN there must
 * reach no row, by K or by V as 0 x NaN; the kernels copy that tile by
 * cp.async with those rows zero-filled today, and the marks runs set a
 * mark past kv_len) */
#define LONG_PAGE(page) {NULL, 16, 1, 128, 128, AK_F32, 0, 0, 1, -1, 0, page, NHD, PAGED, 2, {{260, 260}, {256, 300}}}
/* ... and blocks of the prefill grid with items of both kernels, each
 * kernel skipping the other's (the producer's mask). At DP 256 an item is a
 * tile of 128 rows (8 tokens of 16 heads) of a KV head; plan_prefill deals
 * the items in rounds of the grid's blocks a KV head (132 SMs / KV heads on
 * an H100 or H200), each round's items heaviest first to the least loaded
 * blocks; no split (< 1024 keys). So a block's items come from several
 * requests, and with one request corrupted, from both kernels:
 * LONG_MIXED, one KV head, five prompts of 256 tokens (160 items, more than
 * a round), the corrupted one last; LONG_MIXED4, four KV heads, the
 * corrupted request first (264 tokens against 256: its tiles the heaviest)
 * beside a clean one. The cases check the outputs alone, whichever blocks
 * run both. */
#define LONG_MIXED(qk, vo)                                                                                        \
    {NULL, 16, 1, qk, vo, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED,                                                  \
     5, {{256, 256}, {256, 256}, {256, 256}, {256, 256}, {256, 256}}}
#define LONG_MIXED4(qk, vo) {NULL, 64, 4, qk, vo, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2, {{264, 264}, {256, 256}}}
/* a long request beside a short one the scan pass leaves out (page 128) */
#define LONG_SHORT(qk, vo) {NULL, 16, 1, qk, vo, AK_F32, 0, 0, 1, -1, 0, 128, NHD, PAGED, 2, {{260, 260}, {3, 500}}}

/* MLA (cfg.mla: one latent row a key, V the start of it): 16 heads over
 * rows of 576 / 512, or 4 over 72 / 40 (head dims the cpu backends take,
 * not whole vectors); windows; pages of 1; a multi-token request whose
 * last split chunk its first tokens see none of (with sinks) */
#define MLA(w, ...) {NULL, 16, 1, 576, 512, AK_F32, 0, 0, 1, w, 0, 16, NHD, PAGED, __VA_ARGS__, 0, 0, 1}
#define MLA4(w, ...) {NULL, 4, 1, 72, 40, AK_F32, 0, 0, 1, w, 0, 16, NHD, PAGED, __VA_ARGS__, 0, 0, 1}
#define MLA1(w, ...) {NULL, 16, 1, 576, 512, AK_F32, 0, 0, 1, w, 0, 1, NHD, PAGED, __VA_ARGS__, 0, 0, 1}
#define MLA_DEC MLA(-1, 3, {{1, 40}, {1, 300}, {1, 3000}})
#define MLA_VER MLA(-1, 3, {{4, 300}, {8, 70}, {1, 3000}})
#define MLA_WIN MLA(20, 2, {{6, 300}, {1, 50}})
#define Q_POS(...) {__VA_ARGS__, 1}
#define Q_NEG(...) {__VA_ARGS__, -1}
static const nf_case cases[] = {
    {"mla empty last chunk: NaN in V of last key", MLA(-1, 1, {{8, 1285}}), {IN_K, NAN, 0, 1284, 0, 0, 1}, 4},
    {"mla empty last chunk: NaN in q", MLA(-1, 1, {{8, 1285}}), {IN_Q, NAN, 0, 0, 0, 3, 1}, 4},
    {"mla page1 empty last chunk, an empty request: NaN in q", MLA1(-1, 2, {{8, 1285}, {0, 0}}), {IN_Q, NAN, 0, 0, 0, 3, 1}, 4},
    {"mla page1 window 600 split: NaN in V", MLA1(600, 2, {{8, 1285}, {3, 5}}), {IN_K, NAN, 0, 700, 0, 0, 1}, 4},
    {"mla decode: NaN in V part", MLA_DEC, {IN_K, NAN, 1, 100, 0, 0, 3}, 0},
    {"mla decode: +inf in rope part", MLA_DEC, {IN_K, INFINITY, 0, 39, 0, 0, 570}, 0},
    {"mla decode: NaN in q", MLA_DEC, {IN_Q, NAN, 0, 0, 1, 5, 20}, 0},
    {"mla decode: -inf in q rope", MLA_DEC, {IN_Q, -INFINITY, 0, 0, 0, 15, 575}, 0},
    {"mla decode split: NaN in V middle chunk", MLA_DEC, {IN_K, NAN, 2, 1500, 0, 0, 511}, 4},
    {"mla decode split: NaN in K rope first chunk", MLA_DEC, {IN_K, NAN, 2, 3, 0, 0, 513}, 4},
    {"mla decode split: NaN in q", MLA_DEC, {IN_Q, NAN, 0, 0, 2, 7, 0}, 4},
    {"mla verify: NaN in V of last key (only last token sees)", MLA_VER, {IN_K, NAN, 0, 299, 0, 0, 10}, 0},
    {"mla verify: +inf in V of a key only later tokens see", MLA_VER, {IN_K, INFINITY, 1, 66, 0, 0, 0}, 0},
    {"mla verify: NaN in rope of last key", MLA_VER, {IN_K, NAN, 0, 299, 0, 0, 560}, 0},
    {"mla verify split: NaN in V of key 2999", MLA_VER, {IN_K, NAN, 2, 2999, 0, 0, 5}, 4},
    {"mla verify: NaN in V past kv_len (unused slot)", MLA_VER, {IN_K, NAN, 1, 79, 0, 0, 5}, 0},
    {"mla verify on 4 CPU threads, NaN in V of last key", MLA(-1, 2, {{8, 2000}, {1, 30}}), {IN_K, NAN, 0, 1999, 0, 0, 10}, 4},
    {"mla verify on 4 CPU threads, NaN in V of a key in the middle", MLA(-1, 2, {{8, 2000}, {1, 30}}), {IN_K, NAN, 0, 1000, 0, 0, 10}, 4},
    {"mla window: NaN in V some windows leave out", MLA_WIN, {IN_K, NAN, 0, 276, 0, 0, 7}, 0},
    {"mla window: NaN in K outside every window", MLA_WIN, {IN_K, NAN, 0, 200, 0, 0, 7}, 0},
    {"mla window: NaN in V some windows leave out (late)", MLA_WIN, {IN_K, NAN, 0, 298, 0, 0, 7}, 0},
    {"mla4 72/40 verify: NaN in V of last key", MLA4(-1, 2, {{30, 300}, {2, 40}}), {IN_K, NAN, 0, 299, 0, 0, 39}, 0},
    {"mla4 72/40 verify: NaN in V of last key r1", MLA4(-1, 2, {{30, 300}, {2, 40}}), {IN_K, NAN, 1, 39, 0, 0, 3}, 0},
    {"mla4 72/40 verify: NaN in rope of last key r1", MLA4(-1, 2, {{30, 300}, {2, 40}}), {IN_K, NAN, 1, 39, 0, 0, 60}, 0},
    /* a visible key: NaN, +inf, -inf (a -inf logit would otherwise vanish as a masked key) */
    {"decode: NaN in a visible key", DECODE_BATCH, {IN_K, NAN, 1, 100, 0, 1, 3}, 0},
    {"decode: +inf in a visible key", DECODE_BATCH, {IN_K, INFINITY, 0, 39, 0, 0, 0}, 0},
    {"decode: -inf in a visible key", DECODE_BATCH, {IN_K, -INFINITY, 1, 7, 0, 1, 63}, 0},
    {"decode: NaN in a visible value", DECODE_BATCH, {IN_V, NAN, 0, 5, 0, 0, 10}, 0},
    {"decode: +inf in a visible value", DECODE_BATCH, {IN_V, INFINITY, 1, 299, 0, 1, 0}, 0},
    {"decode: NaN in q", DECODE_BATCH, {IN_Q, NAN, 0, 0, 1, 5, 20}, 0},
    {"decode split: NaN in a key of a middle chunk", DECODE_BATCH, {IN_K, NAN, 2, 1000, 0, 0, 1}, 4},
    {"decode split: NaN in a value of the last chunk", DECODE_BATCH, {IN_V, NAN, 2, 2090, 0, 1, 2}, 4},
    {"decode split: -inf in a key of the first chunk", DECODE_BATCH, {IN_K, -INFINITY, 2, 3, 0, 1, 5}, 4},
    {"decode split: NaN in q", DECODE_BATCH, {IN_Q, NAN, 0, 0, 2, 3, 0}, 4},
    {"prefill: NaN in a key every row sees", PREFILL_BATCH, {IN_K, NAN, 0, 0, 0, 1, 7}, 0},
    {"prefill: +inf in a key", PREFILL_BATCH, {IN_K, INFINITY, 1, 90, 0, 0, 2}, 0},
    {"prefill: -inf in a key", PREFILL_BATCH, {IN_K, -INFINITY, 1, 50, 0, 1, 2}, 0},
    {"prefill: NaN in q", PREFILL_BATCH, {IN_Q, NAN, 0, 0, 45, 6, 9}, 0},
    /* keys only later rows see (causal): the rows before them stay clean,
     * though they share the key's tile */
    {"prefill: NaN in a key only the last rows see", PREFILL_BATCH, {IN_K, NAN, 0, 37, 0, 0, 4}, 0},
    {"prefill: NaN in a value only the last rows see", PREFILL_BATCH, {IN_V, NAN, 0, 37, 0, 0, 4}, 0},
    {"prefill: +inf in a value only the last rows of a chunk see", PREFILL_BATCH, {IN_V, INFINITY, 1, 95, 0, 1, 0},
     0},
    /* keys no row sees: past the causal end of the last query, beyond
     * kv_len in the last page, outside every window */
    {"prefill: NaN in the K and V of an unused page slot", PREFILL_BATCH, {IN_V, NAN, 2, 31, 0, 0, 0}, 0},
    {"window 8: NaN in a value some rows' windows leave out", WIN(8, 2, {{30, 30}, {1, 50}}),
     {IN_V, NAN, 0, 10, 0, 1, 3}, 0},
    {"window 8: NaN in a key some rows' windows leave out", WIN(8, 2, {{30, 30}, {1, 50}}),
     {IN_K, NAN, 0, 12, 0, 0, 3}, 0},
    {"window 8: NaN in a value outside every window", WIN(8, 2, {{30, 30}, {1, 50}}), {IN_V, NAN, 1, 20, 0, 0, 0},
     0},
    {"gqa7 prefill: NaN in q of a second warpgroup's token", GQA7_BATCH, {IN_Q, NAN, 0, 0, 12, 10, 5}, 0},
    {"gqa7 prefill: NaN in a value only the last rows see", GQA7_BATCH, {IN_V, NAN, 0, 35, 0, 2, 100}, 0},
    {"gqa4 prefill: NaN in a value only later rows see, in the earlier items' last tile", GQA4_BATCH(128),
     {IN_V, NAN, 0, 100, 0, 3, 5}, 0},
    {"gqa4 prefill: NaN in a key only later rows see, in the earlier items' last tile", GQA4_BATCH(128),
     {IN_K, NAN, 0, 70, 0, 6, 127}, 0},
    {"gqa4 prefill page 16: +inf in a value only later rows see", GQA4_BATCH(16), {IN_V, INFINITY, 0, 127, 0, 0, 64},
     0},
    {"mha prefill: NaN in a value only the second warpgroup's rows see", MHA128_BATCH,
     {IN_V, NAN, 0, 100, 0, 1, 7}, 0},
    {"mha prefill: NaN in a key of the diagonal tile's first half", MHA128_BATCH, {IN_K, NAN, 0, 40, 0, 2, 100}, 0},
    {"mha prefill: NaN in the value of a chunk's last key", MHA128_BATCH, {IN_V, NAN, 1, 299, 0, 3, 0}, 0},
    {"split chunk: NaN in a value of the prefix", SPLIT_BATCH, {IN_V, NAN, 0, 1500, 0, 1, 1}, 4},
    {"split chunk: NaN in a key only the last row sees", SPLIT_BATCH, {IN_K, NAN, 0, 2999, 0, 1, 1}, 4},
    {"split chunk: -inf in a key", SPLIT_BATCH, {IN_K, -INFINITY, 0, 2500, 0, 0, 0}, 4},
    /* head dims narrower than the GPU kernels' shared-memory rows, and
     * unequal ones: the V scan covers the real dims */
    {"d80 prefill: NaN in a value only the last rows see", DIMS(80, 80, 2, {{150, 150}, {1, 40}}),
     {IN_V, NAN, 0, 140, 0, 1, 79}, 0},
    {"d192/128 prefill: +inf in a value only the last rows see", DIMS(192, 128, 2, {{100, 100}, {1, 40}}),
     {IN_V, INFINITY, 0, 97, 0, 0, 127}, 0},
    {"d192/128 prefill: NaN in a key some rows see", DIMS(192, 128, 2, {{100, 100}, {1, 40}}),
     {IN_K, NAN, 0, 60, 0, 1, 191}, 0},
    /* requests long enough (q_len x group >= 4096 rows, past the threshold of 2048) for the CUDA
     * engine's scan pass: a corrupted one runs checked, the clean one beside
     * it unchecked, and a key outside what the pass reads (before the first
     * window, past kv_len) never flags anything */
    {"long prefill: NaN in a key only the last rows see", LONG_BATCH, {IN_K, NAN, 0, 250, 0, 0, 5}, 0},
    {"long prefill: -inf in a key of the prefix", LONG_BATCH, {IN_K, -INFINITY, 1, 100, 0, 0, 63}, 0},
    {"long prefill: +inf in a value only the last rows see", LONG_BATCH, {IN_V, INFINITY, 1, 650, 0, 0, 0}, 0},
    {"long prefill: NaN in a value every row sees", LONG_BATCH, {IN_V, NAN, 1, 3, 0, 0, 31}, 0},
    {"long prefill: -inf in q", LONG_BATCH, {IN_Q, -INFINITY, 0, 0, 500, 5, 60}, 0},
    {"long prefill: NaN in the K and V of an unused page slot", LONG_BATCH, {IN_V, NAN, 0, 263, 0, 0, 0}, 0},
    {"long page 128 prefill: NaN in the K and V of an unused page slot", LONG_PAGE(128), {IN_V, NAN, 0, 300, 0, 0, 0},
     0},
    {"long page 64 prefill: NaN in the K and V of an unused page slot", LONG_PAGE(64), {IN_V, NAN, 0, 262, 0, 0, 127},
     0},
    {"long page 64 prefill: +inf in a key of a chunk's last tile", LONG_PAGE(64), {IN_K, INFINITY, 1, 299, 0, 0, 3},
     0},
    {"long d256 prefill: NaN in a key only the last rows see", LONG_DIMS(256, 256), {IN_K, NAN, 0, 250, 0, 0, 5}, 0},
    {"long d256 prefill: +inf in a value only the last rows see", LONG_DIMS(256, 256),
     {IN_V, INFINITY, 1, 280, 0, 0, 200}, 0},
    {"long d256 prefill: -inf in q", LONG_DIMS(256, 256), {IN_Q, -INFINITY, 0, 0, 500, 5, 160}, 0},
    {"long d192/128 prefill: NaN in a value every row sees", LONG_DIMS(192, 128), {IN_V, NAN, 1, 3, 0, 0, 31}, 0},
    /* the scan pass's lanes: a row of lanes short of 32 (d96: 24 chunks a
     * key), a second pass of 32 (192/128: V dims 64-127 in lanes 0-7), a
     * key at an odd offset of a task at d128 */
    {"long d96 prefill: NaN in a value's last dim", LONG_DIMS(96, 96), {IN_V, NAN, 1, 77, 0, 0, 95}, 0},
    {"long d192/128 prefill: NaN in a value's last dim", LONG_DIMS(192, 128), {IN_V, NAN, 1, 5, 0, 0, 127}, 0},
    {"long d128 prefill: NaN in a key only the last rows see", LONG_DIMS(128, 128), {IN_K, NAN, 0, 201, 0, 0, 77},
     0},
    /* a long request and 3 tokens verified on a context of 500 (48 rows,
     * too few for the scan pass): in one step the long request's items
     * run by its flags, the short one's checked */
    {"long d128 prefill beside verified tokens: NaN in a key the tokens see", LONG_SHORT(128, 128),
     {IN_K, NAN, 1, 321, 0, 0, 40}, 0},
    {"long d128 prefill beside verified tokens: +inf in a value of the long request", LONG_SHORT(128, 128),
     {IN_V, INFINITY, 0, 77, 0, 0, 100}, 0},
    {"long d256 prefill beside verified tokens: NaN in a value the tokens see", LONG_SHORT(256, 256),
     {IN_V, NAN, 1, 450, 0, 0, 200}, 0},
    {"long d192/128 prefill: -inf in a key of a new token, which only later rows see", LONG_DIMS(192, 128),
     {IN_K, -INFINITY, 1, 100, 0, 0, 150}, 0},
    /* -inf in K: on the unchecked path the key would just vanish (a finite row) */
    {"long d256 prefill, a block's clean item then checked item: -inf in a key only later rows see",
     LONG_MIXED(256, 256), {IN_K, -INFINITY, 4, 100, 0, 0, 200}, 0, 1},
    {"long d192/128 prefill, a block's checked item then clean item: -inf in a key only later rows see",
     LONG_MIXED4(192, 128), {IN_K, -INFINITY, 0, 40, 0, 0, 191}, 0, 1},
    /* d64 (both paths in one kernel): tiles of 192 rows (12 tokens of 16
     * heads), 22 items a request and KV head, 176 in all, dealt in two
     * rounds of an H100's or H200's 132 blocks (plan_prefill: a round's
     * items, heaviest first, to the least loaded blocks), so that some
     * blocks (11, by a model of the planner) run one of the corrupted
     * request's items (checked), then a clean one */
    {"long d64 prefill, a block's checked item then clean item: -inf in a key only later rows see",
     LONG_MIXED4(64, 64), {IN_K, -INFINITY, 0, 40, 0, 0, 63}, 0, 1},
    /* an infinity in K against q of that dim of one sign (q_sign): every
     * product with it -inf, so every row that sees the key has P 0 there
     * and must still be NaN; in the diagonal tile of earlier items (the
     * later rows alone see it), in a prefix, in a split chunk, in warpgroup
     * 0's half of a tile whose last token warpgroup 1 holds */
    {"gqa4 prefill: +inf in a key against q of the other sign, only later rows see", GQA4_BATCH(128),
     Q_NEG(IN_K, INFINITY, 0, 70, 0, 6, 127), 0},
    {"gqa4 prefill page 16: -inf in a key against q of its sign, in the first tile", GQA4_BATCH(16),
     Q_POS(IN_K, -INFINITY, 0, 3, 0, 2, 0), 0},
    {"long prefill: -inf in a key of the prefix against q of its sign", LONG_BATCH,
     Q_POS(IN_K, -INFINITY, 1, 100, 0, 0, 63), 0},
    {"long d128 prefill: -inf in a key against q of its sign, only the last rows see", LONG_DIMS(128, 128),
     Q_POS(IN_K, -INFINITY, 0, 250, 0, 0, 77), 0},
    {"mha prefill: -inf in a key of the diagonal tile's first half against q of its sign", MHA128_BATCH,
     Q_POS(IN_K, -INFINITY, 0, 40, 0, 2, 100), 0},
    {"split chunk: -inf in a key of the prefix against q of its sign", SPLIT_BATCH,
     Q_POS(IN_K, -INFINITY, 0, 1200, 0, 1, 9), 4},
    {"gqa7 prefill: -inf in a key against q of its sign", GQA7_BATCH, Q_POS(IN_K, -INFINITY, 1, 150, 0, 3, 64), 0},
    /* an infinity in q against K of that dim of one sign (q_sign in q):
     * every product of the row -inf, its max -inf with keys seen; in an
     * item's last token (the rows the Hopper kernel's detection reads), in
     * a middle row, in a prefix's long request, in a split chunk */
    {"gqa4 prefill: -inf in q against K of one sign, the last token", GQA4_BATCH(128),
     Q_POS(IN_Q, -INFINITY, 0, 0, 255, 0, 0), 0},
    {"gqa4 prefill page 16: -inf in q against K of one sign", GQA4_BATCH(16), Q_POS(IN_Q, -INFINITY, 0, 0, 100, 6, 127),
     0},
    {"mha prefill: +inf in q against K of the other sign", MHA128_BATCH, Q_NEG(IN_Q, INFINITY, 0, 0, 150, 1, 5), 0},
    {"long d128 prefill: -inf in q against K of one sign", LONG_DIMS(128, 128), Q_POS(IN_Q, -INFINITY, 0, 0, 500, 0, 3),
     0},
    {"split chunk: -inf in q against K of one sign", SPLIT_BATCH, Q_POS(IN_Q, -INFINITY, 0, 0, 5, 1, 2), 4},
    {"long window 64: NaN in a key before every window", MQA16(64, 1, {{260, 1000}}), {IN_K, NAN, 0, 100, 0, 0, 1},
     0},
    {"long window 64: NaN in a value some rows' windows leave out", MQA16(64, 1, {{260, 1000}}),
     {IN_V, NAN, 0, 760, 0, 0, 9}, 0},
    /* the last quarter of a key tile (keys 96-127 of 128): the Hopper
     * kernel's V scan at head dim 64 has 48 rows a pass (three consumer
     * warpgroups), whose last pass is partial */
    {"d64 prefill: NaN in a value at a tile's keys 96-127 only the last rows see", DEC(2, {{120, 120}, {1, 30}}),
     {IN_V, NAN, 0, 110, 0, 1, 7}, 0},
    {"d64 prefill: +inf in a value at a second tile's keys 96-127", DEC(1, {{250, 250}}),
     {IN_V, INFINITY, 0, 230, 0, 0, 40}, 0},
    {"d256 prefill: NaN in a value only the last rows see", DIMS(256, 256, 1, {{260, 260}}),
     {IN_V, NAN, 0, 250, 0, 1, 255}, 0},
    /* head dims 512: the wide kernel, whose second warpgroup scans V */
    {"d512 prefill: NaN in a value only the last rows see", DIMS(512, 512, 2, {{150, 150}, {1, 30}}),
     {IN_V, NAN, 0, 140, 0, 1, 511}, 0},
    {"d512 prefill: +inf in a key some rows see", DIMS(512, 512, 2, {{150, 150}, {1, 30}}),
     {IN_K, INFINITY, 0, 70, 0, 0, 300}, 0},
    {"d512 prefill: NaN in q", DIMS(512, 512, 2, {{150, 150}, {1, 30}}), {IN_Q, NAN, 0, 0, 100, 3, 257}, 0},
    /* fp8 scales (per head): every row of the head's group that sees a key */
    {"decode: NaN k_scale", DECODE_BATCH, {IN_K_SCALE, NAN, 0, 0, 0, 1, 0}, 0},
    {"decode split: +inf v_scale", DECODE_BATCH, {IN_V_SCALE, INFINITY, 0, 0, 0, 0, 0}, 4},
    {"prefill: NaN v_scale", PREFILL_BATCH, {IN_V_SCALE, NAN, 0, 0, 0, 1, 0}, 0},
    {"prefill: -inf k_scale", PREFILL_BATCH, {IN_K_SCALE, -INFINITY, 0, 0, 0, 0, 0}, 0},
};

/* ---- the expectation ----------------------------------------------------------- */

static int sees(const attn_case *tc, int pos, int kv_len, int key)
{
    if (key < 0 || key >= kv_len) return 0;
    if (tc->causal && key > pos) return 0;
    return tc->window_left < 0 || (int64_t)key >= (int64_t)pos - tc->window_left;
}

/* 1 when the corruption must make row (token t, query head h) NaN. */
static int row_hit(const scene *sc, const corruption *b, int t, int h)
{
    const attn_case *tc = &sc->tc;
    int r = 0;
    while (sc->b.qo_indptr[r + 1] <= t) r++;
    const int q_len = sc->b.qo_indptr[r + 1] - sc->b.qo_indptr[r], kv_len = sc->b.kv_lens[r];
    const int pos = kv_len - q_len + (t - sc->b.qo_indptr[r]);
    if (b->where == IN_Q) {
        if (t != b->tok || h != b->head) return 0;
        for (int j = 0; j < kv_len; j++)
            if (sees(tc, pos, kv_len, j)) return 1;
        return 0; /* a row that sees no key never reads q */
    }
    const int group = tc->num_qo_heads / tc->num_kv_heads;
    if (b->where == IN_K_SCALE || b->where == IN_V_SCALE) {
        if (h / group != b->head) return 0;
        for (int j = 0; j < kv_len; j++)
            if (sees(tc, pos, kv_len, j)) return 1;
        return 0;
    }
    return r == b->req && h / group == b->head && sees(tc, pos, kv_len, b->key);
}

/* ---- corrupting the device copy --------------------------------------------- */

static void write_element(ak_device dev, void *base, int64_t elem, ak_dtype t, float value)
{
    unsigned char bytes[4];
    ak_store_from_f32(bytes, t, 0, value);
    const size_t esz = ak_dtype_size(t);
    dev_copy_to(dev, (char *)base + elem * (int64_t)esz, bytes, esz);
}

/* The paged cache's row (in elements of a head's row) of key `key` of
 * request `req` in KV head `head`, through the block table */
static int64_t cache_row(const scene *sc, int req, int key, int head)
{
    const attn_case *tc = &sc->tc;
    const int P = tc->page_size, Hk = tc->num_kv_heads;
    const int64_t blk = sc->b.block_table[req * sc->b.bt_stride + key / P];
    const int s = key % P;
    return tc->layout == AK_LAYOUT_NHD ? (blk * P + s) * Hk + head : (blk * Hk + head) * P + s;
}

static void corrupt(scene *sc, const corruption *b)
{
    const attn_case *tc = &sc->tc;
    const ak_dtype dt = tc->dtype;
    if (b->where == IN_Q) {
        const int64_t row = (int64_t)b->tok * tc->num_qo_heads + b->head;
        write_element(sc->cfg.device, tbuf_data(&sc->q_buf), row * (tc->head_dim_qk + Q_ROW_PAD) + b->dim, dt,
                      b->value);
        return;
    }
    if (b->where == IN_K_SCALE || b->where == IN_V_SCALE) {
        float *scales = tbuf_data(b->where == IN_K_SCALE ? &sc->k_scale_buf : &sc->v_scale_buf);
        dev_copy_to(sc->cfg.device, scales + b->head, &b->value, sizeof b->value);
        return;
    }
    /* the key's slot through the block table; for a key past kv_len (an
     * unused slot of the last page) both K and V are written */
    const int64_t row = cache_row(sc, b->req, b->key, b->head);
    const int past = b->key >= sc->b.kv_lens[b->req];
    const ak_dtype kvt = sc->cfg.kv_dtype;
    if (b->where == IN_K || past)
        write_element(sc->cfg.device, sc->kv.k_data, row * tc->head_dim_qk + b->dim, kvt, b->value);
    if ((b->where == IN_V || past) && sc->kv.v_data) /* (MLA: no V pool, V is K's) */
        write_element(sc->cfg.device, sc->kv.v_data, row * tc->head_dim_vo + b->dim, kvt, b->value);
}

/* q's element b->dim of every token and query head of KV head b->head
 * given sign b->q_sign (a zero becomes +-1), in the logical q and on the
 * device, before the reference is computed from it */
static void sign_q(scene *sc, const corruption *b)
{
    const attn_case *tc = &sc->tc;
    const int Hq = tc->num_qo_heads, group = Hq / tc->num_kv_heads, pitch = tc->head_dim_qk + Q_ROW_PAD;
    const ak_dtype dt = tc->dtype;
    const size_t esz = ak_dtype_size(dt), bytes = esz * (size_t)sc->b.num_tokens * Hq * pitch;
    unsigned char *h = malloc(bytes);
    dev_copy_from(sc->cfg.device, h, tbuf_data(&sc->q_buf), bytes);
    for (int t = 0; t < sc->b.num_tokens; t++)
        for (int g = 0; g < group; g++) {
            const int64_t row = (int64_t)t * Hq + b->head * group + g;
            float *x = &sc->q[row * tc->head_dim_qk + b->dim];
            *x = b->q_sign * (*x != 0.0f ? fabsf(*x) : 1.0f); /* (a sign change is exact in every dtype) */
            ak_store_from_f32(h, dt, row * pitch + b->dim, *x);
        }
    dev_copy_to(sc->cfg.device, tbuf_data(&sc->q_buf), h, bytes);
    free(h);
}

/* K's element b->dim of every key of every request, in the KV head of q's
 * head b->head, given sign b->q_sign (a zero becomes the smallest code of
 * that sign), in the logical K and in the paged cache, before the reference
 * is computed from it. The cache's element is read back and its sign bit
 * set, so that fp8 codes keep their scale. */
static void sign_k(scene *sc, const corruption *b)
{
    const attn_case *tc = &sc->tc;
    const int Hk = tc->num_kv_heads, Dqk = tc->head_dim_qk;
    const int kvh = b->head / (tc->num_qo_heads / Hk);
    const ak_dtype kvt = sc->cfg.kv_dtype;
    const size_t esz = ak_dtype_size(kvt);
    const int sign_bit = (int)esz * 8 - 1;
    for (int r = 0; r < sc->b.num_reqs; r++)
        for (int j = 0; j < sc->b.kv_lens[r]; j++) {
            const int64_t row = cache_row(sc, r, j, kvh);
            char *at = (char *)sc->kv.k_data + (row * Dqk + b->dim) * (int64_t)esz;
            uint32_t code = 0;
            dev_copy_from(sc->cfg.device, &code, at, esz);
            const uint32_t mag = code & ((1u << sign_bit) - 1);
            code = (mag ? mag : 1u) | (b->q_sign < 0 ? 1u << sign_bit : 0u);
            dev_copy_to(sc->cfg.device, at, &code, esz);
            float *x = &sc->k[r][((int64_t)j * Hk + kvh) * Dqk + b->dim];
            const float scale = kvt == AK_FP8_E4M3 ? sc->k_scale[kvh] : 1.0f;
            *x = ak_load_as_f32(&code, kvt, 0) * scale;
        }
}

/* The same corruption of K or V (not q, not a scale) written the way an
 * engine with finiteness marks writes: the key's slot (every KV head's K and
 * V rows, the bad element in one) read back and rewritten by ak_kv_update
 * with the view's marks, which sets the slot's bit for the corrupted head.
 * Returns 0 on success. */
static int corrupt_by_update(scene *sc, const corruption *b)
{
    const attn_case *tc = &sc->tc;
    const int P = tc->page_size, Hk = tc->num_kv_heads, Dqk = tc->head_dim_qk, Dvo = tc->head_dim_vo;
    const int64_t blk = sc->b.block_table[b->req * sc->b.bt_stride + b->key / P];
    const int s = b->key % P;
    const int past = b->key >= sc->b.kv_lens[b->req];
    const ak_dtype kvt = sc->cfg.kv_dtype;
    const size_t esz = ak_dtype_size(kvt);
    const ak_device dev = sc->cfg.device;
    tbuf kb, vb, sb;
    tbuf_alloc(&kb, dev, esz * (size_t)Hk * Dqk);
    tbuf_alloc(&vb, dev, esz * (size_t)Hk * Dvo);
    tbuf_alloc(&sb, dev, sizeof(int64_t));
    for (int h = 0; h < Hk; h++) {
        const int64_t row = cache_row(sc, b->req, b->key, h);
        dev_copy_from(dev, (char *)tbuf_host(&kb) + esz * h * Dqk, (const char *)sc->kv.k_data + esz * row * Dqk,
                      esz * Dqk);
        if (sc->kv.v_data) /* (MLA: no V pool, V is K's) */
            dev_copy_from(dev, (char *)tbuf_host(&vb) + esz * h * Dvo,
                          (const char *)sc->kv.v_data + esz * row * Dvo, esz * Dvo);
    }
    if (b->where == IN_K || past) ak_store_from_f32(tbuf_host(&kb), kvt, (int64_t)b->head * Dqk + b->dim, b->value);
    if (b->where == IN_V || past) ak_store_from_f32(tbuf_host(&vb), kvt, (int64_t)b->head * Dvo + b->dim, b->value);
    *(int64_t *)tbuf_host(&sb) = blk * P + s;
    tbuf_upload(&kb);
    tbuf_upload(&vb);
    tbuf_upload(&sb);
    const ak_tensor kt = ak_tensor_3d(tbuf_data(&kb), kvt, 1, Hk, Dqk), vt = ak_tensor_3d(tbuf_data(&vb), kvt, 1, Hk, Dvo);
    const ak_status st = ak_kv_update(&sc->kv, &kt, sc->kv.v_data ? &vt : NULL, tbuf_data(&sb), 1, NULL);
    dev_sync(dev);
    tbuf_free(&kb);
    tbuf_free(&vb);
    tbuf_free(&sb);
    return st != AK_OK;
}

/* ---- one case on one backend -------------------------------------------------- */

/* Creates backend `name` for the scene with AK_NUM_THREADS = threads (0: as
 * set), plans, runs; o (f32, [T, Hq, Dvo]) and lse come back. Returns the
 * status; *guards: 0 if a write landed outside o or lse. */
/* runs: the plan's run this many times, o and lse poisoned before each (a
 * second run finds whatever state the first left on the device) */
static ak_status run_raw(const scene *sc, const char *name, int threads, int runs, float *o, float *lse, int *guards)
{
    const ak_attn_config *c = &sc->cfg;
    const int T = sc->b.num_tokens, Hq = c->num_qo_heads, Dqk = c->head_dim_qk, Dvo = c->head_dim_vo;
    ak_limits lim = sc->lim;
    lim.max_splits = 8;
    char saved[32] = "";
    if (threads > 0) {
        if (getenv("AK_NUM_THREADS")) snprintf(saved, sizeof saved, "%s", getenv("AK_NUM_THREADS"));
        char v[16];
        snprintf(v, sizeof v, "%d", threads);
        setenv("AK_NUM_THREADS", v, 1);
    }
    ak_backend *b = NULL;
    ak_status st = ak_backend_create(c, &lim, name, &b);
    if (threads > 0) {
        if (saved[0]) setenv("AK_NUM_THREADS", saved, 1);
        else unsetenv("AK_NUM_THREADS");
    }
    *guards = 1;
    if (st != AK_OK) return st;
    const size_t oes = ak_dtype_size(c->o_dtype);
    tbuf ob, lb;
    tbuf_alloc(&ob, c->device, oes * (size_t)T * Hq * Dvo);
    tbuf_alloc(&lb, c->device, sizeof(float) * (size_t)T * Hq);
    ak_tensor q = ak_tensor_3d(tbuf_data(&sc->q_buf), c->q_dtype, T, Hq, Dqk);
    q.stride[1] = Dqk + Q_ROW_PAD;
    q.stride[0] = (int64_t)Hq * q.stride[1];
    ak_tensor ot = ak_tensor_3d(tbuf_data(&ob), c->o_dtype, T, Hq, Dvo);
    ak_tensor lt = ak_tensor_2d(tbuf_data(&lb), AK_F32, T, Hq);
    ak_run_args a;
    ak_run_args_init(&a);
    a.q = &q;
    a.o = &ot;
    a.lse = &lt;
    a.kv = &sc->kv;
    st = ak_backend_plan(b, &sc->b.batch, NULL);
    for (int r = 0; r < runs && st == AK_OK; r++) {
        for (int64_t i = 0; i < (int64_t)T * Hq * Dvo; i++) ak_store_from_f32(tbuf_host(&ob), c->o_dtype, i, SENTINEL);
        for (int64_t i = 0; i < (int64_t)T * Hq; i++) ((float *)tbuf_host(&lb))[i] = SENTINEL;
        tbuf_upload(&ob);
        tbuf_upload(&lb);
        st = ak_backend_run(b, &a, NULL);
        dev_sync(c->device);
    }
    tbuf_download(&ob);
    tbuf_download(&lb);
    *guards = tbuf_guards_ok(&ob) && tbuf_guards_ok(&lb);
    for (int64_t i = 0; i < (int64_t)T * Hq * Dvo; i++) o[i] = ak_load_as_f32(tbuf_host(&ob), c->o_dtype, i);
    memcpy(lse, tbuf_host(&lb), sizeof(float) * (size_t)T * Hq);
    tbuf_free(&ob);
    tbuf_free(&lb);
    ak_backend_destroy(b);
    return st;
}

/* The case's scene for t's device (seeded by its name), or 0 after a
 * failure is reported. */
static int build_case_scene(test_ctx *t, const char *backend, const char *name, const attn_case *tc, scene *sc)
{
    uint64_t rng = t->seed ^ scn_name_hash(name);
    if (!scene_build(sc, tc, t->device, &rng)) return 1;
    t_fail(t, backend, name, "cannot build the scene");
    scene_free(sc);
    return 0;
}

/* Zeroed finiteness marks for the scene's view (its clean pools are finite),
 * in mb (tbuf_free it after). */
static void give_zero_marks(test_ctx *t, scene *sc, tbuf *mb)
{
    const int64_t words = ak_kv_marks_words(sc->kv.num_blocks, sc->kv.num_kv_heads, sc->kv.page_size);
    tbuf_alloc(mb, t->device, sizeof(uint32_t) * (size_t)words);
    memset(tbuf_host(mb), 0, sizeof(uint32_t) * (size_t)words);
    tbuf_upload(mb);
    sc->kv.marks = tbuf_data(mb);
}

/* Runs fn(arg) with AK_CUDA_SCAN_SHORT set to value (NULL: unset): the
 * CUDA engine then gives the shorter requests scan tasks in every plan
 * (1), which a run reads from the pools' marks, or in none (0). */
static void with_scan_short(const char *value, void (*fn)(void *), void *arg)
{
    t_with_env("AK_CUDA_SCAN_SHORT", value, fn, arg);
}

/* dtype: q, o and K/V, or q and o with fp8 K/V (kv_fp8). marks: the view
 * carries finiteness marks (zeroed: the clean scene is finite), and a
 * corruption of K or V goes through ak_kv_update (corrupt_by_update); marks
 * 2: the same with the shorter requests' scan tasks in the plan
 * (AK_CUDA_SCAN_SHORT=1, set by the caller), so that the pass scans every
 * request from the marks; marks 3: no marks, the shorter requests' K/V
 * rows scanned (AK_CUDA_SCAN_SHORT_ROWS=1, set by the caller); marks 4: no
 * marks, the scan pass beside the prefill on 8 SMs (AK_CUDA_SCAN_BESIDE=8,
 * set by the caller), the plan run twice; marks 5: no marks, the scan pass
 * before the prefill (AK_CUDA_SCAN_BESIDE=0, set by the caller). */
static void run_nf_case(test_ctx *t, const char *backend, const nf_case *nc, ak_dtype dtype, int kv_fp8, int marks)
{
    char name[160];
    snprintf(name, sizeof name, "nonfinite %s%s%s: %s", ak_dtype_name(dtype), kv_fp8 ? " fp8_e4m3 KV" : "",
             marks == 5   ? " scan before"
             : marks == 4 ? " scan beside"
             : marks == 3 ? " rows short"
             : marks == 2 ? " marks short"
             : marks      ? " marks"
                          : "",
             nc->name);
    const int on_scale = nc->bad.where == IN_K_SCALE || nc->bad.where == IN_V_SCALE;
    if (!t_selected(t, name) || on_scale != (on_scale && kv_fp8)) return;
    attn_case tc = nc->shape;
    tc.name = name;
    tc.dtype = dtype;
    tc.kv_fp8 = kv_fp8;
    tc.kv_scale = kv_fp8 ? AK_KV_SCALE_PER_HEAD : AK_KV_SCALE_NONE;
    scene sc;
    if (!build_case_scene(t, backend, name, &tc, &sc)) return;
    const int T = sc.b.num_tokens, Hq = tc.num_qo_heads, Dvo = tc.head_dim_vo;
    const int64_t n_o = (int64_t)T * Hq * Dvo, n_l = (int64_t)T * Hq;
    double *ref_o = malloc(sizeof(double) * (size_t)n_o), *ref_l = malloc(sizeof(double) * (size_t)n_l);
    float *o = malloc(sizeof(float) * (size_t)n_o), *l = malloc(sizeof(float) * (size_t)n_l);
    if (nc->bad.q_sign && nc->bad.where == IN_Q) sign_k(&sc, &nc->bad);
    else if (nc->bad.q_sign) sign_q(&sc, &nc->bad);
    dense_attention(&sc, ref_o, ref_l); /* of the clean data: the scene's logical arrays stay clean */
    tbuf mb;
    memset(&mb, 0, sizeof mb);
    const int view_marks = marks == 1 || marks == 2;
    if (view_marks) give_zero_marks(t, &sc, &mb);
    int updated = 1;
    if (view_marks && (nc->bad.where == IN_K || nc->bad.where == IN_V)) updated = !corrupt_by_update(&sc, &nc->bad);
    else corrupt(&sc, &nc->bad);
    int guards = 1;
    /* the scan pass's runs (marks, its variants) keep it at every head dim:
     * the Hopper prefill would find the rule itself instead (attn.cuh) */
    const char *detect = getenv("AK_CUDA_NAN_DETECT");
    char saved[32] = "";
    if (detect) snprintf(saved, sizeof saved, "%s", detect);
    if (marks) setenv("AK_CUDA_NAN_DETECT", "0", 1);
    const ak_status st = updated ? run_raw(&sc, backend, nc->threads, marks == 4 ? 2 : 1, o, l, &guards) : AK_OK;
    if (marks && detect) setenv("AK_CUDA_NAN_DETECT", saved, 1);
    else if (marks) unsetenv("AK_CUDA_NAN_DETECT");
    if (!updated) {
        t_fail(t, backend, name, "ak_kv_update of the corrupted slot: %s", ak_last_error());
    } else if (st == AK_ERR_UNSUPPORTED) {
        t_skip(t, backend, name, "unsupported");
    } else if (st != AK_OK) {
        t_fail(t, backend, name, "status %s: %s", ak_status_str(st), ak_last_error());
    } else {
        /* hit rows: every element and lse NaN; others: the clean reference */
        char why[256] = "";
        int hits = 0;
        double num = 0, den = 0, lse_err = 0;
        for (int tok = 0; tok < T && !why[0]; tok++)
            for (int h = 0; h < Hq && !why[0]; h++) {
                const int64_t row = (int64_t)tok * Hq + h;
                const float *orow = o + row * Dvo;
                const double *rrow = ref_o + row * Dvo;
                if (row_hit(&sc, &nc->bad, tok, h)) {
                    hits++;
                    for (int d = 0; d < Dvo && !why[0]; d++)
                        if (!isnan(orow[d]))
                            snprintf(why, sizeof why, "o[%d][%d][%d] = %g, want NaN (the row sees the element)", tok,
                                     h, d, orow[d]);
                    if (!why[0] && !isnan(l[row]))
                        snprintf(why, sizeof why, "lse[%d][%d] = %g, want NaN", tok, h, l[row]);
                    continue;
                }
                for (int d = 0; d < Dvo && !why[0]; d++) {
                    if (!isfinite(orow[d]) || orow[d] == SENTINEL)
                        snprintf(why, sizeof why, "o[%d][%d][%d] = %g in a row the element must not reach", tok, h,
                                 d, orow[d]);
                    num += (orow[d] - rrow[d]) * (orow[d] - rrow[d]);
                    den += rrow[d] * rrow[d];
                }
                if (why[0]) continue;
                if (isinf(ref_l[row]) || isinf(l[row])) {
                    if (!(ref_l[row] == -INFINITY && l[row] == -INFINITY))
                        snprintf(why, sizeof why, "lse[%d][%d] = %g, want %g", tok, h, l[row], ref_l[row]);
                } else {
                    const double e = fabs(l[row] - ref_l[row]);
                    if (e != e) lse_err = INFINITY;
                    else if (e > lse_err) lse_err = e;
                }
            }
        const double err = den > 0 ? sqrt(num / den) : sqrt(num);
        const double tol = tolerance(dtype), lse_tol = dtype == AK_F32 ? 1e-4 : 2e-3;
        if (!why[0] && !(err <= tol)) snprintf(why, sizeof why, "clean rows: rel err %.2e (tol %.0e)", err, tol);
        if (!why[0] && !(lse_err <= lse_tol))
            snprintf(why, sizeof why, "clean rows: lse err %.2e (tol %.0e)", lse_err, lse_tol);
        if (!why[0] && !guards) snprintf(why, sizeof why, "write outside o or lse (guard bytes changed)");
        if (why[0])
            t_fail(t, backend, name, "%s", why);
        else
            t_pass(t, backend, name, "%d NaN rows, clean rows rel err %.2e", hits, err);
    }
    free(ref_o);
    free(ref_l);
    free(o);
    free(l);
    if (view_marks) tbuf_free(&mb);
    scene_free(&sc);
}

/* A case whose prefill requests are all under the scan pass's threshold for
 * K/V rows (run with their tasks forced: "marks short", and from the rows:
 * "rows short") */
static int short_prefill_case(const char *name)
{
    static const char *const prefixes[] = {"prefill",      "window", "gqa7 prefill",     "gqa4 prefill", "mha prefill",
                                           "d256 prefill", "d80 ",   "d192/128 prefill", "d64 ",         "split chunk"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return 1;
    return 0;
}

typedef struct nf_run {
    test_ctx *t;
    const char *backend;
    const nf_case *nc;
    int kv_fp8;
} nf_run;

static void run_nf_marks_short(void *arg)
{
    const nf_run *r = arg;
    run_nf_case(r->t, r->backend, r->nc, AK_BF16, r->kv_fp8, 2);
}

static void run_nf_rows_short(void *arg)
{
    const nf_run *r = arg;
    run_nf_case(r->t, r->backend, r->nc, AK_BF16, r->kv_fp8, 3);
}

/* The CUDA scan pass beside the prefill (AK_CUDA_SCAN_BESIDE, set by the
 * caller; at DP 256, where the clean requests' items have a kernel of
 * their own): every scanned item runs unchecked first, from a queue, and a
 * corrupted request's again, checked, after. Run twice, so that the second
 * run takes its items from the queue the first left. */
static void run_nf_beside(void *arg)
{
    const nf_run *r = arg;
    run_nf_case(r->t, r->backend, r->nc, AK_BF16, r->kv_fp8, 4);
}

/* The same cases with the scan pass before the prefill
 * (AK_CUDA_SCAN_BESIDE=0, set by the caller; the default runs it beside
 * where it can): every scanned item waits for the flags. */
static void run_nf_before(void *arg)
{
    const nf_run *r = arg;
    run_nf_case(r->t, r->backend, r->nc, AK_BF16, r->kv_fp8, 5);
}

/* ---- ak_kv_update's finiteness marks ------------------------------------------ */

/* The CUDA scan pass reads the marks, not the rows: -inf written into a key
 * past ak_kv_update (its bit left clear, against the contract) reaches the
 * unchecked path, where a row whose q is positive at that dim gets a -inf
 * logit and drops the key: a finite row. Reading the rows (the same case
 * without marks, "long prefill: -inf in a key of the prefix") makes every
 * row that sees the key NaN. The short variants: requests under the pass's
 * threshold for K/V rows, with their tasks in the plan
 * (AK_CUDA_SCAN_SHORT=1, set by the caller): read from the marks the same
 * way; without marks (no_marks) never scanned, so every row that sees the
 * key is NaN (checked). All with AK_CUDA_NAN_DETECT=0 (set by the caller):
 * a kernel that finds the rule's cases itself would find this one. */
typedef struct read_case {
    test_ctx *t;
    const char *backend;
    int shorter, no_marks;
} read_case;

static void marks_read_case(void *arg)
{
    const read_case *rc = arg;
    test_ctx *t = rc->t;
    const char *backend = rc->backend;
    char name[160];
    snprintf(name, sizeof name, "nonfinite bf16 marks: the pass reads the bits%s (-inf written past kv_update, %s)",
             rc->shorter ? ", short requests" : "", rc->no_marks ? "no marks: checked" : "unseen");
    if (strcmp(backend, "cuda_paged") || !t_selected(t, name)) return;
    /* short: 2 x 100 tokens x 16 heads, 1600 rows a request */
    attn_case tc = rc->shorter ? (attn_case)MQA16(-1, 2, {{100, 100}, {100, 400}}) : (attn_case)LONG_BATCH;
    tc.name = name;
    tc.dtype = AK_BF16;
    const corruption bad = {IN_K, -INFINITY, 1, rc->shorter ? 350 : 100, 0, 0, 63};
    scene sc;
    if (!build_case_scene(t, backend, name, &tc, &sc)) return;
    const int T = sc.b.num_tokens, Hq = tc.num_qo_heads, Dvo = tc.head_dim_vo;
    float *o = malloc(sizeof(float) * (size_t)T * Hq * Dvo), *l = malloc(sizeof(float) * (size_t)T * Hq);
    tbuf mb;
    memset(&mb, 0, sizeof mb);
    if (!rc->no_marks) give_zero_marks(t, &sc, &mb);
    corrupt(&sc, &bad);
    int guards = 1, hits = 0, finite = 0;
    const ak_status st = run_raw(&sc, backend, 0, 1, o, l, &guards);
    for (int tok = 0; tok < T && st == AK_OK; tok++)
        for (int h = 0; h < Hq; h++)
            if (row_hit(&sc, &bad, tok, h)) {
                hits++;
                finite += isfinite(o[((int64_t)tok * Hq + h) * Dvo]) != 0;
            }
    if (st != AK_OK) t_fail(t, backend, name, "status %s: %s", ak_status_str(st), ak_last_error());
    else if (!guards) t_fail(t, backend, name, "write outside o or lse (guard bytes changed)");
    else if (hits == 0) t_fail(t, backend, name, "no row sees the key (the case's shape)");
    else if (rc->no_marks && finite > 0)
        t_fail(t, backend, name, "%d of the %d rows that see the key finite: a task no pass scanned ran unchecked",
               finite, hits);
    else if (rc->no_marks) t_pass(t, backend, name, "all %d rows that see the key NaN (the checked path)", hits);
    else if (finite == 0)
        t_fail(t, backend, name, "all %d rows that see the key are NaN: the pass read the K/V rows, not the marks", hits);
    else t_pass(t, backend, name, "%d of the %d rows that see the key finite (the unchecked path)", finite, hits);
    free(o);
    free(l);
    if (!rc->no_marks) tbuf_free(&mb);
    scene_free(&sc);
}

/* marks_read_case with AK_CUDA_SCAN_SHORT=1 for the short variants */
static void marks_read_scan_short(void *arg)
{
    const read_case *rc = arg;
    with_scan_short(rc->shorter ? "1" : NULL, marks_read_case, arg);
}

/* One write of the marks test: rows of src dtype (the pool's, or bf16 into
 * fp8) with a head row stride of D + pad elements (pad 1: no 16-byte path);
 * bad[i][h] says where a non-finite element goes (0: none). */
typedef struct marks_cfg {
    ak_dtype pool, src;
    ak_kv_layout layout;
    int pad;
    int konly; /* a K-only view (MLA): no V pool, no v */
} marks_cfg;

/* Writes n tokens at slots (distinct; one -1) and checks every word of the
 * marks against want, updated here: a written slot's bit is whether its K or
 * V row of that head went in non-finite, every other bit as it was. */
static int marks_write(test_ctx *t, const marks_cfg *mc, ak_paged_kv *kv, tbuf *marks, uint32_t *want,
                       const int64_t *slots, int n, int with_bad, uint64_t *rng, char *why, size_t cap)
{
    const int Hk = kv->num_kv_heads, W = (kv->page_size + 31) / 32;
    const size_t esz = ak_dtype_size(mc->src);
    const int dims[2] = {kv->head_dim_qk, kv->head_dim_vo};
    tbuf rows[2], sb;
    for (int r = 0; r < 2; r++) {
        const int64_t st1 = dims[r] + mc->pad;
        tbuf_alloc(&rows[r], t->device, esz * (size_t)(n * Hk * st1));
        for (int64_t i = 0; i < n * Hk * st1; i++) ak_store_from_f32(tbuf_host(&rows[r]), mc->src, i, scn_uniform(rng));
    }
    tbuf_alloc(&sb, t->device, sizeof(int64_t) * (size_t)n);
    memcpy(tbuf_host(&sb), slots, sizeof(int64_t) * (size_t)n);
    static const float bad_values[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hk; h++) {
            const int bad = with_bad && scn_rng_int(rng, 0, 9) < 4;
            if (bad) { /* one element of the K or the V row */
                const int r = mc->konly ? 0 : scn_rng_int(rng, 0, 1), d = scn_rng_int(rng, 0, dims[r] - 1);
                const int64_t st1 = dims[r] + mc->pad;
                ak_store_from_f32(tbuf_host(&rows[r]), mc->src, ((int64_t)i * Hk + h) * st1 + d,
                                  bad_values[scn_rng_int(rng, 0, 2)]);
            }
            if (slots[i] < 0) continue;
            const int64_t b = slots[i] / kv->page_size, s = slots[i] % kv->page_size;
            uint32_t *w = want + (b * Hk + h) * W + s / 32;
            *w = bad ? *w | 1u << (s % 32) : *w & ~(1u << (s % 32));
        }
    for (int r = 0; r < 2; r++) tbuf_upload(&rows[r]);
    tbuf_upload(&sb);
    ak_tensor kt = ak_tensor_3d(tbuf_data(&rows[0]), mc->src, n, Hk, dims[0]);
    ak_tensor vt = ak_tensor_3d(tbuf_data(&rows[1]), mc->src, n, Hk, dims[1]);
    kt.stride[1] = dims[0] + mc->pad, kt.stride[0] = Hk * kt.stride[1];
    vt.stride[1] = dims[1] + mc->pad, vt.stride[0] = Hk * vt.stride[1];
    const ak_status st = ak_kv_update(kv, &kt, mc->konly ? NULL : &vt, tbuf_data(&sb), n, NULL);
    dev_sync(t->device);
    tbuf_download(marks);
    const int64_t words = ak_kv_marks_words(kv->num_blocks, Hk, kv->page_size);
    int ok = st == AK_OK;
    if (!ok) snprintf(why, cap, "ak_kv_update: %s", ak_last_error());
    for (int64_t i = 0; i < words && ok; i++)
        if (((uint32_t *)tbuf_host(marks))[i] != want[i]) {
            snprintf(why, cap, "marks word %lld = %08x, want %08x", (long long)i, ((uint32_t *)tbuf_host(marks))[i],
                     want[i]);
            ok = 0;
        }
    for (int r = 0; r < 2; r++) tbuf_free(&rows[r]);
    tbuf_free(&sb);
    return ok;
}

/* ak_kv_update keeps the marks exactly on the device under test: pages of 40
 * slots (a second word of 8), 3 heads of 64 / 32 dims, the marks poisoned
 * with random bits first (bits of slots not written keep them); a write with
 * NaN and infinities sets bits, the same slots rewritten finite clear them. */
static void marks_cases(test_ctx *t)
{
    static const marks_cfg cfgs[] = {
        {AK_BF16, AK_BF16, AK_LAYOUT_NHD, 0}, {AK_F16, AK_F16, AK_LAYOUT_HND, 0},
        {AK_F32, AK_F32, AK_LAYOUT_NHD, 1},  /* 2-byte pieces of f32 rows */
        {AK_F16, AK_F16, AK_LAYOUT_NHD, 1},  {AK_FP8_E4M3, AK_FP8_E4M3, AK_LAYOUT_NHD, 0},
        {AK_FP8_E4M3, AK_FP8_E4M3, AK_LAYOUT_HND, 1}, /* 1-byte pieces */
        {AK_FP8_E4M3, AK_BF16, AK_LAYOUT_NHD, 0},       /* quantized */
        {AK_FP8_E4M3, AK_F32, AK_LAYOUT_HND, 0},  {AK_FP8_E4M3, AK_F16, AK_LAYOUT_NHD, 1},
        {AK_F32, AK_F32, AK_LAYOUT_HND, 0},       {AK_BF16, AK_BF16, AK_LAYOUT_NHD, 0, 1}, /* K-only (MLA) */
        {AK_FP8_E4M3, AK_BF16, AK_LAYOUT_NHD, 0, 1},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        const marks_cfg *mc = &cfgs[c];
        char name[128];
        snprintf(name, sizeof name, "nonfinite kv_update marks: %s rows into %s %s, pad %d%s", ak_dtype_name(mc->src),
                 ak_dtype_name(mc->pool), mc->layout == AK_LAYOUT_NHD ? "NHD" : "HND", mc->pad,
                 mc->konly ? ", K-only" : "");
        if (!t_selected(t, name)) continue;
        uint64_t rng = t->seed ^ scn_name_hash(name);
        enum { BLOCKS = 5, PAGE = 40, HK = 3, N = 24 };
        ak_paged_kv kv;
        memset(&kv, 0, sizeof kv);
        kv.dtype = mc->pool;
        kv.layout = mc->layout;
        kv.device = t->device;
        kv.num_blocks = BLOCKS;
        kv.page_size = PAGE;
        kv.num_kv_heads = HK;
        kv.head_dim_qk = 64;
        kv.head_dim_vo = 32;
        tbuf kp, vp, mb;
        const size_t esz = ak_dtype_size(mc->pool);
        tbuf_alloc(&kp, t->device, esz * BLOCKS * PAGE * HK * 64);
        tbuf_alloc(&vp, t->device, esz * BLOCKS * PAGE * HK * 32);
        const int64_t words = ak_kv_marks_words(BLOCKS, HK, PAGE);
        tbuf_alloc(&mb, t->device, sizeof(uint32_t) * (size_t)words);
        uint32_t *want = malloc(sizeof(uint32_t) * (size_t)words);
        for (int64_t i = 0; i < words; i++) want[i] = ((uint32_t *)tbuf_host(&mb))[i] = (uint32_t)scn_rng_next(&rng);
        tbuf_upload(&mb);
        kv.k_data = tbuf_data(&kp);
        kv.v_data = mc->konly ? NULL : tbuf_data(&vp);
        kv.marks = tbuf_data(&mb);
        int32_t perm[BLOCKS * PAGE];
        for (int i = 0; i < BLOCKS * PAGE; i++) perm[i] = i;
        scn_shuffle_i32(&rng, perm, BLOCKS * PAGE);
        int64_t slots[N];
        for (int i = 0; i < N; i++) slots[i] = i == 5 ? -1 : perm[i];
        char why[160] = "";
        const int ok = words == BLOCKS * HK * 2 &&
                       marks_write(t, mc, &kv, &mb, want, slots, N, 1, &rng, why, sizeof why) &&
                       marks_write(t, mc, &kv, &mb, want, slots, N, 0, &rng, why, sizeof why);
        if (ok) t_pass(t, NULL, name, "ok");
        else t_fail(t, NULL, name, "%s", why[0] ? why : "ak_kv_marks_words");
        free(want);
        tbuf_free(&kp);
        tbuf_free(&vp);
        tbuf_free(&mb);
    }
}

/* A CUDA ak_kv_cache made with cfg.marks: each layer's view carries its own
 * zeroed words (ak_dev_calloc on the device), kept by ak_kv_update. */
static void cache_marks_case(test_ctx *t)
{
    const char *name = "nonfinite kv_update marks: a CUDA cache's own marks (cfg.marks)";
    if (t->device.kind != AK_DEVICE_CUDA || !t_selected(t, name)) return;
    enum { BLOCKS = 6, PAGE = 48, HK = 2, D = 16 };
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_layers = 2;
    kc.num_blocks = BLOCKS;
    kc.page_size = PAGE;
    kc.num_kv_heads = HK;
    kc.head_dim_qk = kc.head_dim_vo = D;
    kc.dtype = AK_BF16;
    kc.device = t->device;
    kc.marks = 1;
    ak_kv_cache *c = NULL;
    ak_paged_kv kv[2];
    ak_status st = ak_kv_cache_create(&kc, &c);
    for (int l = 0; l < 2 && st == AK_OK; l++) st = ak_kv_cache_layer(c, l, &kv[l]);
    const int64_t words = ak_kv_marks_words(BLOCKS, HK, PAGE); /* 24 */
    uint32_t got[2][BLOCKS * HK * 2];
    char why[160] = "";
    if (st != AK_OK) snprintf(why, sizeof why, "status %s: %s", ak_status_str(st), ak_last_error());
    else if (!kv[0].marks || !kv[1].marks || kv[0].marks == kv[1].marks || words != BLOCKS * HK * 2)
        snprintf(why, sizeof why, "the views' marks %p %p, %lld words", (void *)kv[0].marks, (void *)kv[1].marks,
                 (long long)words);
    for (int l = 0; l < 2 && !why[0]; l++) {
        dev_copy_from(t->device, got[l], kv[l].marks, sizeof got[l]);
        for (int64_t i = 0; i < words && !why[0]; i++)
            if (got[l][i]) snprintf(why, sizeof why, "layer %d word %lld = %#x at create, want 0", l, (long long)i, got[l][i]);
    }
    /* an infinity in head 0's K at block 4 slot 40 (word (4 x 2 + 0) x 2 +
     * 1 = 17, bit 8) of layer 0 */
    tbuf kb, vb, sb;
    tbuf_alloc(&kb, t->device, sizeof(uint16_t) * HK * D);
    tbuf_alloc(&vb, t->device, sizeof(uint16_t) * HK * D);
    tbuf_alloc(&sb, t->device, sizeof(int64_t));
    for (int i = 0; i < HK * D; i++) {
        ((uint16_t *)tbuf_host(&kb))[i] = ak_f32_to_bf16(0.5f);
        ((uint16_t *)tbuf_host(&vb))[i] = ak_f32_to_bf16(-0.5f);
    }
    ((uint16_t *)tbuf_host(&kb))[7] = ak_f32_to_bf16(INFINITY);
    *(int64_t *)tbuf_host(&sb) = 4 * PAGE + 40;
    tbuf_upload(&kb);
    tbuf_upload(&vb);
    tbuf_upload(&sb);
    const ak_tensor kt = ak_tensor_3d(tbuf_data(&kb), AK_BF16, 1, HK, D), vt = ak_tensor_3d(tbuf_data(&vb), AK_BF16, 1, HK, D);
    if (!why[0]) {
        st = ak_kv_update(&kv[0], &kt, &vt, tbuf_data(&sb), 1, NULL);
        dev_sync(t->device);
        if (st != AK_OK) snprintf(why, sizeof why, "ak_kv_update: %s", ak_last_error());
    }
    for (int l = 0; l < 2 && !why[0]; l++) {
        dev_copy_from(t->device, got[l], kv[l].marks, sizeof got[l]);
        for (int64_t i = 0; i < words && !why[0]; i++) {
            const uint32_t want = l == 0 && i == 17 ? 1u << 8 : 0;
            if (got[l][i] != want)
                snprintf(why, sizeof why, "layer %d word %lld = %#x after the write, want %#x", l, (long long)i,
                         got[l][i], want);
        }
    }
    if (why[0]) t_fail(t, NULL, name, "%s", why);
    else t_pass(t, NULL, name, "ok");
    tbuf_free(&kb);
    tbuf_free(&vb);
    tbuf_free(&sb);
    ak_kv_cache_destroy(c);
}

/* ---- ak_merge_states ------------------------------------------------------------ */

/* 4 states of 2 heads x 8 dims, one token; the bad element goes to state
 * `pos` of head 1, so head 0 is the clean control. */
static void merge_case(test_ctx *t, const char *what, int pos, int in_lse, float value, int empty_state,
                       int want_nan)
{
    char name[128];
    snprintf(name, sizeof name, "nonfinite merge_states: %s at state %d", what, pos);
    if (!t_selected(t, name)) return;
    enum { S = 4, H = 2, D = 8 };
    float v[S][H][D], s[S][H], vo[H][D], so[H];
    uint64_t rng = t->seed ^ scn_name_hash(name);
    for (int i = 0; i < S * H * D; i++) ((float *)v)[i] = scn_uniform(&rng);
    for (int i = 0; i < S * H; i++) ((float *)s)[i] = 2.0f * scn_uniform(&rng);
    if (empty_state) s[pos][1] = -INFINITY;
    /* the formula on the clean states (empty ones left out) */
    double want[H][D], want_lse[H];
    for (int h = 0; h < H; h++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < S; i++) mx = s[i][h] > mx ? s[i][h] : mx;
        for (int i = 0; i < S; i++) sum += s[i][h] == -INFINITY ? 0 : exp(s[i][h] - mx);
        want_lse[h] = mx + log(sum);
        for (int d = 0; d < D; d++) {
            want[h][d] = 0;
            for (int i = 0; i < S; i++)
                if (s[i][h] != -INFINITY) want[h][d] += exp(s[i][h] - want_lse[h]) * v[i][h][d];
        }
    }
    if (in_lse)
        s[pos][1] = value;
    else
        v[pos][1][5] = value;
    memset(vo, 0xff, sizeof vo);
    memset(so, 0xff, sizeof so);
    ak_tensor vt = ak_tensor_4d(v, AK_F32, 1, S, H, D), st_ = ak_tensor_3d(s, AK_F32, 1, S, H);
    ak_tensor vot = ak_tensor_3d(vo, AK_F32, 1, H, D), sot = ak_tensor_2d(so, AK_F32, 1, H);
    const ak_device cpu = {AK_DEVICE_CPU, 0};
    const ak_status st = ak_merge_states(&vt, &st_, &vot, &sot, cpu, NULL);
    int ok = st == AK_OK;
    double worst = 0;
    for (int h = 0; h < H; h++) {
        const int nan_row = h == 1 && want_nan;
        ok &= nan_row ? isnan(so[h]) : fabs(so[h] - want_lse[h]) < 1e-5;
        for (int d = 0; d < D; d++) {
            if (nan_row) {
                ok &= isnan(vo[h][d]);
            } else {
                const double e = fabs(vo[h][d] - want[h][d]);
                worst = e > worst || e != e ? e : worst;
            }
        }
    }
    if (ok && worst < 1e-5)
        t_pass(t, NULL, name, "ok");
    else
        t_fail(t, NULL, name, "status %s; head 1: lse %g, o[0] %g, o[5] %g (want %s); head 0 worst err %.2e",
               ak_status_str(st), so[1], vo[1][0], vo[1][5], want_nan ? "NaN" : "the clean merge", worst);
}

static void merge_cases(test_ctx *t)
{
    for (int pos = 0; pos < 4; pos++) {
        merge_case(t, "NaN lse", pos, 1, NAN, 0, 1);
        merge_case(t, "+inf lse", pos, 1, INFINITY, 0, 1);
        merge_case(t, "NaN in v", pos, 0, NAN, 0, 1);
        merge_case(t, "-inf in v", pos, 0, -INFINITY, 0, 1);
        merge_case(t, "NaN in the v of an empty state", pos, 0, NAN, 1, 0);
    }
}

void test_nonfinite(test_ctx *t)
{
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    /* f32 on the CPU; the 16-bit dtypes every backend takes (the cpu
     * backend's AMX kernel, where the CPU has one, serves bf16 prefill) */
    static const ak_dtype cpu_dtypes[] = {AK_F32, AK_BF16}, gpu_dtypes[] = {AK_BF16, AK_F16};
    const ak_dtype *dtypes = t->device.kind == AK_DEVICE_CUDA ? gpu_dtypes : cpu_dtypes;
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            if (cases[c].gpu_only && t->device.kind != AK_DEVICE_CUDA) continue;
            /* the long cases are there for the CUDA scan pass (their rows
             * pass its threshold); on the CPU they run in f32 alone, and
             * the short cases cover bf16 and fp8 K/V */
            const int is_long = !strncmp(cases[c].name, "long", 4);
            const int cpu_long = t->device.kind == AK_DEVICE_CPU && is_long;
            for (int d = 0; d < (cpu_long ? 1 : 2); d++) run_nf_case(t, names[i], &cases[c], dtypes[d], 0, 0);
            if (!cpu_long)
                run_nf_case(t, names[i], &cases[c], t->device.kind == AK_DEVICE_CUDA ? AK_BF16 : AK_F32, 1, 0);
            /* the CUDA scan pass from the pools' finiteness marks (long
             * requests: the cases that have the pass); the shorter
             * requests' prefill with their tasks in every plan */
            if (t->device.kind == AK_DEVICE_CUDA && is_long)
                for (int f = 0; f < 2; f++) {
                    run_nf_case(t, names[i], &cases[c], AK_BF16, f, 1);
                    nf_run r = {t, names[i], &cases[c], f};
                    t_with_env("AK_CUDA_SCAN_BESIDE", "8", run_nf_beside, &r);
                    t_with_env("AK_CUDA_SCAN_BESIDE", "0", run_nf_before, &r);
                }
            if (t->device.kind == AK_DEVICE_CUDA && short_prefill_case(cases[c].name))
                for (int f = 0; f < 2; f++) {
                    nf_run r = {t, names[i], &cases[c], f};
                    with_scan_short("1", run_nf_marks_short, &r);
                    t_with_env("AK_CUDA_SCAN_SHORT_ROWS", "1", run_nf_rows_short, &r);
                }
        }
    for (int i = 0; i < nb && t->device.kind == AK_DEVICE_CUDA; i++)
        for (int v = 0; v < 3; v++) {
            read_case rc = {t, names[i], v > 0, v == 2};
            t_with_env("AK_CUDA_NAN_DETECT", "0", marks_read_scan_short, &rc);
        }
    marks_cases(t);
    cache_marks_case(t);
    if (t->device.kind == AK_DEVICE_CPU) merge_cases(t);
}
