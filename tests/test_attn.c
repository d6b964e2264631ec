/*
 * test_attn.c - the case table: every backend of the device under test whose
 * check() accepts a case is run on it and compared with cpu_ref (itself
 * compared with the dense formula of harness.c). Unsupported = SKIP.
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NHD AK_LAYOUT_NHD
#define HND AK_LAYOUT_HND
#define PAGED AK_KV_PAGED
#define RAGGED AK_KV_RAGGED

/* name, Hq, Hkv, Dqk, Dvo, dtype, sinks, o_f32, causal, window, cap,
 * page, layout, storage, num_reqs, {q_len, kv_len}... */
static const attn_case fixed_cases[] = {
    {"decode mha f32 ragged lengths", 4, 4, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{1, 1}, {1, 17}, {1, 113}, {1, 1030}}},
    {"decode gqa4 bf16 d128", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{1, 1}, {1, 17}, {1, 113}, {1, 1030}}},
    {"decode gqa8 f16 d128 page1", 16, 2, 128, 128, AK_F16, 0, 0, 1, -1, 0, 1, NHD, PAGED, 3,
     {{1, 5}, {1, 64}, {1, 300}}},
    {"decode mqa f16 d256 page64", 8, 1, 256, 256, AK_F16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 3,
     {{1, 63}, {1, 64}, {1, 1100}}},
    {"decode phi3 d96", 4, 4, 96, 96, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2, {{1, 40}, {1, 257}}},
    {"decode hnd f16", 8, 2, 128, 128, AK_F16, 0, 0, 1, -1, 0, 16, HND, PAGED, 3, {{1, 15}, {1, 16}, {1, 333}}},
    {"decode many requests", 8, 2, 64, 64, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 64,
     {{1, 1}, {1, 2}, {1, 3}, {1, 17}, {1, 31}, {1, 32}, {1, 33}, {1, 100}, {1, 7}, {1, 250},
      {1, 1}, {1, 2}, {1, 3}, {1, 17}, {1, 31}, {1, 32}, {1, 33}, {1, 100}, {1, 7}, {1, 250},
      {1, 1}, {1, 2}, {1, 3}, {1, 17}, {1, 31}, {1, 32}, {1, 33}, {1, 100}, {1, 7}, {1, 250},
      {1, 1}, {1, 2}, {1, 3}, {1, 17}, {1, 31}, {1, 32}, {1, 33}, {1, 100}, {1, 7}, {1, 250},
      {1, 1}, {1, 2}, {1, 3}, {1, 17}, {1, 31}, {1, 32}, {1, 33}, {1, 100}, {1, 7}, {1, 250},
      {1, 1}, {1, 2}, {1, 3}, {1, 17}, {1, 31}, {1, 32}, {1, 33}, {1, 100}, {1, 7}, {1, 250},
      {1, 9}, {1, 10}, {1, 11}, {1, 12}}},
    {"decode long context split", 4, 1, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 1, {{1, 4100}}},
    /* one KV head at batch 1: at d128 it splits across the GPU's whole wave
     * (hundreds of partials, merged in narrow slices), at d512 into the
     * most chunks of a unit (wide slices) */
    {"decode mqa 20000 keys (split across the wave)", 8, 1, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 1,
     {{1, 20000}}},
    {"decode mqa d512 20000 keys (split into many)", 8, 1, 512, 512, AK_F16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 1,
     {{1, 20000}}},
    /* split decodes and their merges: MHA on the CUDA cores over 5000
     * keys, 8 query heads a block at batch 8, sinks with the LSE, and
     * decode splits beside prefill splits in one plan's merge tasks */
    {"decode mha d64 long split", 4, 4, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2, {{1, 5000}, {1, 37}}},
    {"decode gqa8 batch 8 split", 8, 1, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 8,
     {{1, 3000}, {1, 2900}, {1, 3100}, {1, 17}, {1, 2048}, {1, 3000}, {1, 2999}, {1, 1}}},
    {"decode sinks split with lse", 16, 4, 128, 128, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{1, 6000}, {1, 200}}},
    {"mixed decode splits and prefill splits", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{1, 6000}, {64, 8000}, {1, 2500}, {16, 3000}}},
    {"decode gqa2 d256 soft-cap 50 (gemma2)", 16, 8, 256, 256, AK_BF16, 0, 0, 1, -1, 50.0f, 16, NHD, PAGED, 3,
     {{1, 100}, {1, 17}, {1, 2000}}},
    {"decode gqa3 d128 window 100", 12, 4, 128, 128, AK_F16, 0, 0, 1, 100, 0, 16, HND, PAGED, 3,
     {{1, 99}, {1, 101}, {1, 1500}}},
    {"decode gqa32 (two 16-head tiles)", 32, 1, 64, 64, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{1, 300}, {1, 33}}},
    {"decode soft-cap 1.0 window 0", 8, 2, 64, 64, AK_F16, 0, 0, 1, 0, 1.0f, 16, NHD, PAGED, 2, {{1, 50}, {1, 1}}},
    {"prefill causal f32", 4, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3, {{17, 17}, {113, 113}, {64, 64}}},
    {"prefill causal bf16 d128", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 1}, {17, 17}, {130, 130}}},
    {"prefill 1000+ tokens", 2, 1, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 1, {{1030, 1030}}},
    /* more prefill tiles than thread blocks: each block runs several items
     * in turn, with key-tile counts that leave its K/V stage ring at every
     * offset (the wgmma kernel's stage of tile t is (tiles before + t) %
     * stages: a bug there passed every smaller case) */
    {"prefill several items per block f16 d64", 8, 8, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 24,
     {{150, 150}, {260, 260}, {200, 200}, {333, 333}, {129, 129}, {300, 300}, {170, 170}, {257, 257},
      {150, 150}, {260, 260}, {200, 200}, {333, 333}, {129, 129}, {300, 300}, {170, 170}, {257, 257},
      {150, 150}, {260, 260}, {200, 200}, {333, 333}, {129, 129}, {300, 300}, {170, 170}, {257, 257}}},
    {"prefill several items per block bf16 d128 gqa4", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED,
     16, {{160, 160}, {97, 97}, {200, 200}, {140, 140}, {160, 160}, {97, 97}, {200, 200}, {140, 140},
          {160, 160}, {97, 97}, {200, 200}, {140, 140}, {160, 160}, {97, 97}, {200, 200}, {140, 140}}},
    /* d256 on pages of whole 128-key tiles (a TMA box a tile) and of 64 keys
     * (two boxes a tile), with tiles cut by kv_end; the MQA case has 4096+
     * rows a request (the scan pass, then the clean pass) */
    {"prefill d256 page 128 gqa4 whole tiles", 8, 2, 256, 256, AK_BF16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 3,
     {{300, 300}, {1, 400}, {130, 700}}},
    {"prefill d256 page 64 hnd f16", 8, 2, 256, 256, AK_F16, 0, 0, 1, -1, 0, 64, HND, PAGED, 2,
     {{260, 520}, {70, 70}}},
    {"prefill d256 mqa16 page 128 (scanned)", 16, 1, 256, 256, AK_BF16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 2,
     {{300, 300}, {260, 900}}},
    {"prefill d64 mqa16 page 128 (scanned)", 16, 1, 64, 64, AK_BF16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 2,
     {{300, 300}, {260, 900}}},
    {"chunked prefill on a prefix", 4, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{32, 200}, {100, 1030}, {5, 17}}},
    {"mixed prefill+decode", 8, 2, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 6,
     {{1, 500}, {40, 40}, {1, 17}, {64, 300}, {1, 1}, {7, 7}}},
    {"verify 2-8 tokens", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{2, 100}, {4, 57}, {8, 300}, {3, 3}}},
    {"non-causal encoder", 4, 4, 64, 64, AK_F32, 0, 0, 0, -1, 0, 16, NHD, PAGED, 2, {{33, 33}, {100, 100}}},
    {"cross attention q>kv, empty kv", 4, 2, 64, 64, AK_F32, 0, 0, 0, -1, 0, 16, NHD, PAGED, 3,
     {{50, 20}, {3, 200}, {2, 0}}},
    {"sliding window 32", 8, 2, 128, 128, AK_BF16, 0, 0, 1, 32, 0, 16, NHD, PAGED, 4,
     {{1, 500}, {40, 40}, {100, 300}, {1, 20}}},
    {"window 0 (self only)", 4, 4, 64, 64, AK_F32, 0, 0, 1, 0, 0, 16, NHD, PAGED, 2, {{1, 30}, {9, 9}}},
    {"soft-cap 1.0", 4, 2, 64, 64, AK_F32, 0, 0, 1, -1, 1.0f, 16, NHD, PAGED, 2, {{1, 300}, {20, 60}}},
    /* the f32 cases above again in 16-bit (GPU backends take f16/bf16 only),
     * and what only a tiled GPU kernel can get wrong: groups that do not
     * divide its row tile, groups larger than it, odd pages, split prefixes */
    {"non-causal encoder bf16 d128", 8, 2, 128, 128, AK_BF16, 0, 0, 0, -1, 0, 16, NHD, PAGED, 2,
     {{33, 33}, {300, 300}}},
    {"cross attention q>kv, empty kv f16", 4, 2, 64, 64, AK_F16, 0, 0, 0, -1, 0, 16, NHD, PAGED, 3,
     {{50, 20}, {3, 200}, {2, 0}}},
    {"window 0 (self only) f16", 4, 4, 64, 64, AK_F16, 0, 0, 1, 0, 0, 16, NHD, PAGED, 3, {{1, 30}, {9, 9}, {70, 200}}},
    {"soft-cap 1.0 bf16", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 1.0f, 16, NHD, PAGED, 3,
     {{1, 300}, {20, 60}, {200, 700}}},
    {"qwen gqa7 page 3 chunks", 28, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 3, NHD, PAGED, 3,
     {{1, 100}, {50, 300}, {130, 130}}},
    /* groups that do not divide a warpgroup's 64 rows: the Hopper prefill
     * packs whole tokens into each warpgroup's rows where the tile holds as
     * many (7 heads: 9 + 9 tokens, 12: 5 + 5, 3: 21 + 21, 20: 3 + 3, 48:
     * 1 + 1, a warp of no token's rows; at d64, three warpgroups: 7 heads 9
     * x 3), q and o then by TMA boxes a warpgroup (an item of 9 tokens, a
     * segment's, by cp.async); at head dims 80-128, 5 heads (12 + 12 tokens
     * against 25) and 6 (10 + 10 against 21) lose a token a tile to it */
    {"prefill gqa7 d128 page 128 several items per block", 28, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 128, NHD,
     PAGED, 9, {{200, 200}, {126, 126}, {18, 18}, {37, 500}, {300, 300}, {1, 1}, {90, 90}, {19, 19}, {9, 9}}},
    {"prefill gqa7 d64 f16 (three warpgroups)", 14, 2, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 5,
     {{100, 100}, {27, 27}, {54, 300}, {5, 5}, {9, 9}}},
    {"prefill gqa3 d64 bf16 page 128 (the tile's packing: 64 tokens)", 12, 4, 64, 64, AK_BF16, 0, 0, 1, -1, 0, 128,
     NHD, PAGED, 3, {{64, 64}, {200, 200}, {21, 21}}},
    {"prefill gqa3 d128 window soft-cap page 64", 12, 4, 128, 128, AK_BF16, 0, 0, 1, 50, 30.0f, 64, NHD, PAGED, 3,
     {{100, 100}, {42, 42}, {60, 400}}},
    {"prefill gqa12 chunk on a long prefix (split)", 24, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{64, 3100}, {10, 10}, {1, 40}}},
    {"prefill gqa20 ragged", 20, 1, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3, {{30, 30}, {6, 6}, {13, 100}}},
    {"prefill gqa48 d96 (a warp of no token)", 48, 1, 96, 96, AK_F16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 2,
     {{10, 10}, {3, 50}}},
    {"prefill gqa5 d128 hnd (12 + 12 tokens a tile)", 40, 8, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 64, HND, PAGED, 3,
     {{100, 100}, {25, 25}, {7, 200}}},
    {"prefill gqa5 d128 page 128 several items per block", 40, 8, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 128, NHD,
     PAGED, 8, {{12, 12}, {24, 24}, {25, 25}, {48, 300}, {1, 1}, {13, 13}, {200, 200}, {36, 36}}},
    {"prefill gqa6 d96 f16 (10 + 10 tokens a tile)", 12, 2, 96, 96, AK_F16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 5,
     {{10, 10}, {20, 20}, {21, 21}, {60, 200}, {150, 150}}},
    {"prefill gqa6 d128 ragged", 24, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 4,
     {{20, 20}, {10, 10}, {41, 41}, {5, 90}}},
    /* last key tiles of which a warpgroup's rows see at most the first 64
     * keys (of the Hopper kernel's 128): MHA, whose warpgroup 0 holds
     * tokens 0-63 of each 128-token row tile (the diagonal); items of one
     * key tile; chunks on a prefix whose keys end 1-64 into a tile;
     * non-causal short last tiles; 8 heads a group (16 tokens a row tile) */
    {"prefill mha d128 page 128 last tiles seen in part", 4, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 7,
     {{64, 64}, {65, 65}, {192, 192}, {193, 193}, {40, 300}, {8, 129}, {250, 250}}},
    {"prefill non-causal d128 short last tiles", 8, 2, 128, 128, AK_F16, 0, 0, 0, -1, 0, 64, NHD, PAGED, 4,
     {{30, 30}, {100, 190}, {64, 64}, {7, 129}}},
    {"prefill gqa8 d96 last tiles seen in part", 16, 2, 96, 96, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{16, 16}, {40, 40}, {100, 100}, {33, 160}}},
    {"gqa160 (two row tiles)", 160, 1, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, HND, PAGED, 2, {{20, 40}, {1, 50}}},
    /* (the Hopper prefill's tile at d64 is 192 rows: gqa160 fits one, 200
     * takes two of 100 heads there as well) */
    {"gqa200 d64 (two row tiles on every prefill kernel)", 200, 1, 64, 64, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED,
     2, {{12, 30}, {1, 45}}},
    {"verify on long prefixes (split keys)", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{4, 3000}, {8, 2500}, {2, 4100}, {3, 700}}},
    {"non-causal decode on empty kv f16", 8, 2, 64, 64, AK_F16, 0, 0, 0, -1, 0, 16, NHD, PAGED, 3,
     {{1, 0}, {1, 5}, {4, 0}}},
    /* whole row tiles with no key: each warp's rows are loaded by other
     * warps, and nothing may land over the zero rows the epilogue writes */
    {"non-causal prefill on empty kv bf16 d128 mha", 8, 8, 128, 128, AK_BF16, 0, 0, 0, -1, 0, 16, NHD, PAGED, 3,
     {{40, 0}, {17, 33}, {130, 0}}},
    /* a 64-token chunk on a 3036 prefix, 8/2 heads (32 tokens a GPU tile):
     * split chunks of 512 keys put a boundary (3072) inside the second
     * tile's diagonal (3068..3099), so some rows see nothing in a chunk */
    {"split chunk boundary inside the diagonal", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{64, 3100}, {1, 50}}},
    {"chunk on a long prefix d256 window", 8, 2, 256, 256, AK_F16, 0, 0, 1, 1000, 0, 16, NHD, PAGED, 2,
     {{40, 3000}, {1, 2000}}},
    {"gemma2 soft-cap 50 d256", 16, 8, 256, 256, AK_BF16, 0, 0, 1, -1, 50.0f, 16, NHD, PAGED, 3,
     {{1, 100}, {1, 17}, {24, 40}}},
    {"mistral window 64 gqa4", 16, 4, 128, 128, AK_BF16, 0, 0, 1, 64, 0, 16, NHD, PAGED, 3,
     {{1, 1000}, {30, 200}, {1, 65}}},
    /* a window whose first seen key sits inside a page and past a 32-key
     * tile's start (the cpu AMX path packs whole tiles of a chunk's keys) */
    {"chunk window 29 page 3 bf16", 8, 2, 64, 64, AK_BF16, 0, 0, 1, 29, 0, 3, NHD, PAGED, 2,
     {{200, 600}, {1, 40}}},
    {"dvo != dqk (192/128)", 8, 2, 192, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 50}, {20, 20}, {5, 70}}},
    {"bf16 in, f32 out", 8, 2, 128, 128, AK_BF16, 0, 1, 1, -1, 0, 16, NHD, PAGED, 2, {{1, 100}, {10, 30}}},
    {"empty requests in a batch", 4, 2, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 5,
     {{0, 0}, {1, 20}, {0, 33}, {5, 5}, {0, 0}}},
    {"prefill hnd page 64", 4, 2, 128, 128, AK_F16, 0, 0, 1, -1, 0, 64, HND, PAGED, 2, {{70, 70}, {3, 200}}},
    /* pages of whole key tiles (the GPU prefill's TMA copies: 128-key tiles,
     * a box a tile, or two on pages of 64n keys): rows of 96 (a box's columns past
     * them), a page size that is not a power of two, split chunks on long
     * prefixes, 192/128 */
    {"prefill hnd page 128 d96 gqa4 on prefixes", 16, 4, 96, 96, AK_BF16, 0, 0, 1, -1, 0, 128, HND, PAGED, 3,
     {{100, 100}, {70, 1000}, {33, 3100}}},
    {"prefill page 192 192/128 f16 long prefix", 8, 2, 192, 128, AK_F16, 0, 0, 1, -1, 0, 192, NHD, PAGED, 2,
     {{64, 3000}, {129, 129}}},
    /* pages of half a 128-key tile (two TMA boxes a tile, each on its page) */
    {"prefill page 64 d128 gqa4 bf16 on prefixes", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 3,
     {{64, 2000}, {300, 300}, {7, 135}}},
    /* pages of 16n keys that hold no half tile (TMA boxes of 32 or 16
     * rows, 4 or 8 a tile's column block, each within a page): 32, 48
     * (three boxes of 16 a page), 80, and d256 on pages of 16 (32 boxes a
     * tile) */
    {"prefill page 32 d128 gqa4 bf16 on prefixes", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 32, NHD, PAGED, 3,
     {{64, 2000}, {300, 300}, {7, 135}}},
    {"prefill page 48 d96 hnd f16 on prefixes", 8, 2, 96, 96, AK_F16, 0, 0, 1, -1, 0, 48, HND, PAGED, 3,
     {{200, 1200}, {129, 129}, {5, 400}}},
    {"prefill page 80 192/128 bf16 long prefix", 8, 2, 192, 128, AK_BF16, 0, 0, 1, -1, 0, 80, NHD, PAGED, 2,
     {{64, 3000}, {140, 140}}},
    {"prefill page 16 d256 hnd bf16 window 200", 8, 2, 256, 256, AK_BF16, 0, 0, 1, 200, 0, 16, HND, PAGED, 2,
     {{300, 300}, {100, 900}}},
    {"ragged prefill", 4, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3, {{17, 17}, {113, 113}, {1, 1}}},
    {"ragged cross attention", 4, 2, 128, 128, AK_BF16, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 3,
     {{30, 77}, {5, 1}, {2, 0}}},
    {"ragged chunk window softcap", 8, 2, 64, 64, AK_F16, 0, 0, 1, 16, 20.0f, 0, NHD, RAGGED, 2,
     {{20, 100}, {1, 40}}},
    /* ragged K/V in 16 bits: cuda_varlen and cuda_paged's ragged mode (request
     * r's keys are rows kv_indptr[r] .. of one contiguous K and V) */
    {"ragged prefill bf16 d128 gqa4", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 4,
     {{1, 1}, {17, 17}, {130, 130}, {64, 64}}},
    {"ragged prefill f16 d64 mha", 4, 4, 64, 64, AK_F16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{33, 33}, {200, 200}, {2, 2}}},
    {"ragged prefill bf16 d256 mqa", 8, 1, 256, 256, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 2,
     {{40, 40}, {100, 100}}},
    {"ragged encoder non-causal f16 d128", 8, 2, 128, 128, AK_F16, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 2,
     {{33, 33}, {300, 300}}},
    {"ragged cross attention, kv 0 f16 d64", 8, 2, 64, 64, AK_F16, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 5,
     {{50, 20}, {3, 200}, {2, 0}, {1, 0}, {1, 37}}},
    {"ragged cross attention bf16 d256 gqa2", 16, 8, 256, 256, AK_BF16, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 2,
     {{7, 300}, {64, 5}}},
    {"ragged window 32 bf16 d128", 8, 2, 128, 128, AK_BF16, 0, 0, 1, 32, 0, 0, NHD, RAGGED, 3,
     {{100, 100}, {40, 40}, {1, 1}}},
    {"ragged soft-cap 30 d256 gqa2", 16, 8, 256, 256, AK_BF16, 0, 0, 1, -1, 30.0f, 0, NHD, RAGGED, 2,
     {{24, 24}, {70, 70}}},
    {"ragged non-causal window 8 soft-cap 5 f16", 8, 2, 64, 64, AK_F16, 0, 0, 0, 8, 5.0f, 0, NHD, RAGGED, 3,
     {{30, 30}, {10, 50}, {40, 12}}},
    {"ragged decode batch", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{1, 100}, {1, 4100}, {1, 17}}},
    {"ragged mixed decode+chunks", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 5,
     {{1, 500}, {40, 40}, {1, 17}, {64, 300}, {0, 10}}},
    {"ragged verify on long keys (split)", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{4, 3000}, {8, 2500}, {2, 4100}}},
    {"ragged gqa160 (two row tiles) f16", 160, 1, 64, 64, AK_F16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 2,
     {{20, 20}, {1, 50}}},
    {"ragged qwen gqa7 bf16", 28, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 2, {{50, 50}, {130, 130}}},
    {"ragged empty requests f16", 4, 2, 64, 64, AK_F16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 4,
     {{0, 0}, {5, 5}, {0, 33}, {1, 1}}},
    /* head dims that are not whole SIMD vectors (the cpu backend's tail paths), odd page size;
     * on the GPU a pair outside the tensor-core table: the portable kernel */
    {"head dims 72/40, page 3", 8, 2, 72, 40, AK_F16, 0, 0, 1, -1, 0, 3, HND, PAGED, 3,
     {{1, 100}, {20, 20}, {5, 60}}},
    /* every head dim of the tensor-core table, decode + prefill + chunk in one batch */
    {"head dim 80 gqa4 bf16", 16, 4, 80, 80, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{1, 300}, {40, 40}, {20, 200}, {1, 2100}}},
    {"head dim 96 phi3 mha bf16 hnd", 8, 8, 96, 96, AK_BF16, 0, 0, 1, -1, 0, 16, HND, PAGED, 3,
     {{1, 200}, {70, 70}, {9, 150}}},
    {"head dim 112 gqa2 f16 page 1", 8, 4, 112, 112, AK_F16, 0, 0, 1, -1, 0, 1, NHD, PAGED, 3,
     {{1, 100}, {33, 33}, {5, 60}}},
    {"head dim 192 gqa4 bf16 window", 8, 2, 192, 192, AK_BF16, 0, 0, 1, 100, 0, 16, NHD, PAGED, 3,
     {{1, 500}, {40, 40}, {64, 300}}},
    {"head dims 128/64 f16", 8, 2, 128, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 100}, {50, 50}, {3, 80}}},
    {"head dims 192/128 mla prefill ragged bf16", 16, 16, 192, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{70, 70}, {1, 1}, {130, 130}}},
    {"head dims 192/128 split decode bf16", 8, 2, 192, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{1, 3000}, {1, 40}}},
    /* head dim 512: decode on the wide-row tensor-core kernel (16, 32 or 64
     * heads a block), prefill on the wide wgmma kernel on sm_90 (64 rows a
     * tile; the portable kernel elsewhere) */
    {"head dim 512 mha bf16", 4, 4, 512, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 300}, {20, 40}, {1, 2500}}},
    {"head dim 512 gqa8 decode f16", 16, 2, 512, 512, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 100}, {1, 33}, {1, 1030}}},
    {"head dim 512 gqa32 decode bf16 (32 rows a block)", 32, 1, 512, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 70}, {1, 2100}, {1, 1}}},
    {"head dim 512 gqa48 decode f16 hnd page1 (64 rows, 48 used)", 96, 2, 512, 512, AK_F16, 0, 0, 1, -1, 0, 1, HND,
     PAGED, 2, {{1, 300}, {1, 33}}},
    {"head dim 512 sinks window soft-cap split decode", 8, 2, 512, 512, AK_BF16, 1, 0, 1, 100, 30.0f, 16, NHD, PAGED,
     3, {{1, 3000}, {1, 50}, {5, 60}}},
    {"head dim 512 ragged decode bf16", 8, 2, 512, 512, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{1, 700}, {1, 1}, {1, 64}}},
    {"head dim 512 prefill gqa4 f16 (16 tokens a tile)", 8, 2, 512, 512, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{130, 130}, {1, 1}, {64, 64}, {70, 200}}},
    {"head dim 512 prefill gqa16 bf16 hnd page1", 32, 2, 512, 512, AK_BF16, 0, 0, 1, -1, 0, 1, HND, PAGED, 2,
     {{33, 33}, {100, 300}}},
    {"head dim 512 prefill sinks window soft-cap", 8, 2, 512, 512, AK_BF16, 1, 0, 1, 100, 30.0f, 16, NHD,
     PAGED, 2, {{150, 150}, {20, 500}}},
    {"head dim 512 prefill ragged non-causal", 4, 4, 512, 512, AK_BF16, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 2,
     {{70, 90}, {5, 5}}},
    {"head dim 512 chunks on long prefixes (split)", 4, 1, 512, 512, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{16, 5000}, {3, 2500}}},
    {"head dim 512 prefill several items per block mha", 4, 4, 512, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 12,
     {{150, 150}, {260, 260}, {65, 65}, {129, 129}, {300, 300}, {170, 170},
      {150, 150}, {64, 64}, {200, 200}, {63, 63}, {129, 129}, {257, 257}}},
    /* outside the table: the portable kernel on the GPU, 16-byte copies (multiples of 8) or
     * element copies (any other), split-KV through its merge */
    {"head dims 100/36 element copies f16", 8, 2, 100, 36, AK_F16, 0, 0, 1, -1, 0, 5, NHD, PAGED, 3,
     {{1, 2200}, {20, 20}, {5, 60}}},
    {"head dim 32 gqa8 soft-cap bf16", 16, 2, 32, 32, AK_BF16, 0, 0, 1, -1, 20.0f, 16, NHD, PAGED, 3,
     {{1, 100}, {30, 30}, {4, 50}}},
    {"head dims 96/64 ragged cross f16", 8, 4, 96, 64, AK_F16, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 3,
     {{20, 70}, {1, 0}, {40, 12}}},
    /* attention sinks (gpt-oss: 64/8 heads, head dim 64, window 128 and full layers) */
    {"sinks gpt-oss window 128", 64, 8, 64, 64, AK_BF16, 1, 0, 1, 127, 0, 16, NHD, PAGED, 4,
     {{1, 300}, {40, 200}, {1, 1}, {130, 130}}},
    {"sinks gpt-oss full", 64, 8, 64, 64, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 300}, {40, 200}, {70, 70}}},
    {"sinks split decode and verify", 8, 1, 64, 64, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 4100}, {8, 3000}, {1, 20}}},
    {"sinks empty rows non-causal f16", 8, 2, 64, 64, AK_F16, 1, 0, 0, -1, 0, 16, NHD, PAGED, 3,
     {{3, 0}, {1, 10}, {1, 0}}},
    {"sinks f32 soft-cap", 4, 2, 64, 64, AK_F32, 1, 0, 1, -1, 30.0f, 16, NHD, PAGED, 2, {{1, 100}, {20, 60}}},
    {"sinks ragged prefill bf16 d128", 16, 4, 128, 128, AK_BF16, 1, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{40, 40}, {1, 1}, {100, 100}}},
    {"sinks portable d100 f16", 8, 2, 100, 100, AK_F16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 2, {{1, 2200}, {20, 20}}},
    /* fp8 e4m3 K/V (dtype: q and o), against cpu_ref on the dequantized
     * values: per-head, per-layer and no scales; every workload and layout */
    {"fp8 decode gqa4 bf16 d128 per-head", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 4,
     {{1, 1}, {1, 17}, {1, 113}, {1, 1030}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 decode long context split per-layer", 4, 1, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 1,
     {{1, 4100}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER},
    {"fp8 decode mqa d256 page64 per-layer", 32, 1, 256, 256, AK_BF16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 3,
     {{1, 63}, {1, 64}, {1, 1100}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER},
    {"fp8 decode gqa8 page1 hnd f32 per-head", 16, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 1, HND, PAGED, 3,
     {{1, 5}, {1, 64}, {1, 300}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 prefill causal f16 hnd page64 per-head", 8, 2, 128, 128, AK_F16, 0, 0, 1, -1, 0, 64, HND, PAGED, 3,
     {{1, 1}, {17, 17}, {130, 130}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 prefill 1000+ tokens f32 per-layer", 2, 1, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 1,
     {{1030, 1030}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER},
    {"fp8 chunked prefill on a prefix bf16 per-head", 4, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{32, 200}, {100, 1030}, {5, 17}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 mixed prefill+decode f16 no scales", 8, 2, 64, 64, AK_F16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 6,
     {{1, 500}, {40, 40}, {1, 17}, {64, 300}, {1, 1}, {7, 7}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_NONE},
    {"fp8 verify on long prefixes (split) bf16", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{4, 3000}, {8, 2500}, {2, 4100}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 sliding window 32 bf16 per-layer", 8, 2, 128, 128, AK_BF16, 0, 0, 1, 32, 0, 16, NHD, PAGED, 4,
     {{1, 500}, {40, 40}, {100, 300}, {1, 20}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER},
    {"fp8 window 100 hnd f32 per-head", 12, 4, 128, 128, AK_F32, 0, 0, 1, 100, 0, 16, HND, PAGED, 3,
     {{1, 99}, {30, 101}, {1, 1500}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 head dims 72/40 page 3 f16 per-head", 8, 2, 72, 40, AK_F16, 0, 0, 1, -1, 0, 3, HND, PAGED, 3,
     {{1, 100}, {20, 20}, {5, 60}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 sinks soft-cap 30 f32 per-head", 4, 2, 64, 64, AK_F32, 1, 0, 1, -1, 30.0f, 16, NHD, PAGED, 2,
     {{1, 100}, {20, 60}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 non-causal encoder, empty kv f16", 8, 2, 96, 96, AK_F16, 0, 0, 0, -1, 0, 16, NHD, PAGED, 3,
     {{33, 33}, {3, 200}, {2, 0}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 bf16 in, f32 out per-layer", 8, 2, 128, 128, AK_BF16, 0, 1, 1, -1, 0, 16, NHD, PAGED, 2,
     {{1, 100}, {10, 30}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER},
    {"fp8 ragged prefill bf16 d128 gqa4 per-head", 16, 4, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 4,
     {{1, 1}, {17, 17}, {130, 130}, {64, 64}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"fp8 ragged cross attention f32 per-layer", 4, 2, 64, 64, AK_F32, 0, 0, 0, -1, 0, 0, NHD, RAGGED, 3,
     {{30, 77}, {5, 1}, {2, 0}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER},
    {"fp8 ragged decode + chunk f16 no scales", 8, 2, 64, 64, AK_F16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{1, 4100}, {20, 100}, {1, 17}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_NONE},
    /* multi-head latent attention (DeepSeek-V2/V3 absorbed): one latent KV
     * head, V = the first head_dim_vo of each K row, a K-only cache. 576/512
     * at 16 heads (V3 over TP8) and 128 (V3); 72/64 runs the same paths
     * fast: decodes over all heads in place, split-KV past 256 keys, verify
     * of 2-8 tokens, chunks long enough for single-head tiles */
    {"mla decode 576/512 h16 bf16 page64", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 5,
     {{1, 1}, {1, 63}, {1, 65}, {1, 300}, {1, 1100}}, .mla = 1},
    {"mla decode 576/512 h128 f16 page1", 128, 1, 576, 512, AK_F16, 0, 0, 1, -1, 0, 1, NHD, PAGED, 3,
     {{1, 1}, {1, 40}, {1, 600}}, .mla = 1},
    {"mla verify 1-8 tokens 576/512 h16 bf16 page16", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 5,
     {{2, 100}, {4, 57}, {8, 700}, {1, 1}, {3, 3}}, .mla = 1},
    /* the small pages (a tile of keys across many blocks) and the largest */
    {"mla decode 576/512 h16 bf16 page2 split", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 2, NHD, PAGED, 3,
     {{1, 300}, {2, 33}, {1, 1}}, .mla = 1},
    {"mla verify 576/512 h32 f16 page4", 32, 1, 576, 512, AK_F16, 0, 0, 1, -1, 0, 4, NHD, PAGED, 3,
     {{3, 130}, {1, 9}, {8, 8}}, .mla = 1},
    {"mla decode 576/512 h64 bf16 page8 split", 64, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 8, NHD, PAGED, 3,
     {{1, 1500}, {2, 77}, {1, 2}}, .mla = 1},
    {"mla 576/512 h128 bf16 page128 split mid-page", 128, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 3,
     {{1, 1300}, {2, 200}, {1, 129}}, .mla = 1},
    /* up to 64 / heads tokens of a request one item on the wgmma kernel:
     * the causal diagonal across a split boundary, a last split the first
     * tokens see none of (8258 = 43 x 192 + 2 keys: 64 splits at most a
     * unit, so chunks of 192 on the GPU) */
    {"mla verify packed 576/512 h16 bf16 page64 diagonal across splits", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0,
     64, NHD, PAGED, 4, {{4, 8258}, {2, 65}, {3, 129}, {5, 64}}, .mla = 1},
    {"mla verify packed 576/512 h32 f16 page1 sinks", 32, 1, 576, 512, AK_F16, 1, 0, 1, -1, 0, 1, NHD, PAGED, 3,
     {{2, 4097}, {7, 100}, {2, 2}}, .mla = 1},
    {"mla verify 576/512 h128 bf16 page64", 128, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 3,
     {{2, 130}, {8, 8}, {1, 300}}, .mla = 1},
    {"mla 576/512 h16 f32 out, decode + chunk", 16, 1, 576, 512, AK_BF16, 0, 1, 1, -1, 0, 64, NHD, PAGED, 3,
     {{1, 2100}, {40, 300}, {0, 0}}, .mla = 1},
    {"mla small 72/64 f32 mixed page16", 8, 1, 72, 64, AK_F32, 0, 0, 1, -1, 0, 16, NHD, PAGED, 6,
     {{1, 2100}, {8, 300}, {5, 5}, {0, 0}, {1, 1}, {100, 1030}}, .mla = 1},
    {"mla small 72/64 bf16 page1 hnd", 4, 1, 72, 64, AK_BF16, 0, 0, 1, -1, 0, 1, HND, PAGED, 4,
     {{1, 700}, {4, 20}, {1, 2}, {64, 64}}, .mla = 1},
    {"mla small 72/64 f16 page64 decode split", 16, 1, 72, 64, AK_F16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 4,
     {{1, 4100}, {1, 63}, {1, 64}, {1, 1}}, .mla = 1},
    {"mla small 72/64 f16 ragged", 8, 1, 72, 64, AK_F16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 4,
     {{1, 500}, {6, 6}, {0, 0}, {70, 70}}, .mla = 1},
    {"mla 576/512 h16 bf16 ragged prefill", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 2,
     {{1, 1}, {40, 40}}, .mla = 1},
    {"mla 576/512 h32 bf16 page64 sinks soft-cap", 32, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 30.0f, 64, NHD, PAGED, 4,
     {{1, 2000}, {3, 90}, {1, 1}, {8, 8}}, .mla = 1},
    {"mla 576/512 h64 f16 page16 non-causal window 100", 64, 1, 576, 512, AK_F16, 0, 0, 0, 100, 0, 16, NHD, PAGED,
     3, {{2, 300}, {1, 40}, {4, 4}}, .mla = 1},
    {"mla 576/512 h128 bf16 page32 mtp split", 128, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 32, NHD, PAGED, 2,
     {{2, 3000}, {1, 5000}}, .mla = 1},
    /* more items than a 128-head grid has blocks (66 on an H100): blocks
     * go on to further items, their stages' phases carried across items */
    {"mla 576/512 h128 bf16 page16 several items a block", 128, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD,
     PAGED, 3, {{70, 90}, {1, 900}, {3, 3}}, .mla = 1},
    {"mla fp8 576/512 h16 bf16 page64 per-layer", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 64, NHD, PAGED, 3,
     {{1, 700}, {4, 57}, {1, 1}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER, .mla = 1},
    {"mla fp8 576/512 h128 f16 page32 no scales mtp split", 128, 1, 576, 512, AK_F16, 0, 0, 1, -1, 0, 32, NHD,
     PAGED, 3, {{2, 2500}, {1, 40}, {3, 3}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_NONE, .mla = 1},
    {"mla fp8 576/512 h32 bf16 ragged per-head sinks", 32, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{1, 300}, {4, 40}, {1, 1}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD, .mla = 1},
    {"head dim 512 fp8 gqa4 decode per-head", 16, 4, 512, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 1500}, {1, 33}, {1, 1}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD},
    {"mla fp8 small 72/64 f32 ragged per-head", 8, 1, 72, 64, AK_F32, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{1, 300}, {8, 40}, {20, 20}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD, .mla = 1},
};

/* Runs one case on every backend of the device under test. */
void run_case(test_ctx *t, const attn_case *tc)
{
    if (!t_selected(t, tc->name) || !t_storage_selected(t, tc->storage)) return;
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    const ak_device cpu = {AK_DEVICE_CPU, 0};

    /* oracle: cpu_ref on a CPU twin of the scene (same seed -> same data) */
    uint64_t seed = t->seed ^ scn_name_hash(tc->name);
    uint64_t rng = seed;
    scene ref_sc;
    if (scene_build(&ref_sc, tc, cpu, &rng)) {
        t_fail(t, "cpu_ref", tc->name, "cannot build the scene");
        return;
    }
    const int64_t n_o = (int64_t)ref_sc.b.num_tokens * tc->num_qo_heads * tc->head_dim_vo;
    const int64_t n_l = (int64_t)ref_sc.b.num_tokens * tc->num_qo_heads;
    double *dense_o = malloc(sizeof(double) * (size_t)(n_o + 1));
    double *dense_l = malloc(sizeof(double) * (size_t)(n_l + 1));
    float *ref_o = malloc(sizeof(float) * (size_t)(n_o + 1));
    float *ref_l = malloc(sizeof(float) * (size_t)(n_l + 1));
    double *ref_od = malloc(sizeof(double) * (size_t)(n_o + 1));
    double *ref_ld = malloc(sizeof(double) * (size_t)(n_l + 1));
    float *o = malloc(sizeof(float) * (size_t)(n_o + 1));
    float *l = malloc(sizeof(float) * (size_t)(n_l + 1));
    dense_attention(&ref_sc, dense_o, dense_l);

    char bad[256];
    const double tol = tolerance(tc->o_f32 ? AK_F32 : tc->dtype);
    const double lse_tol = tc->dtype == AK_F32 ? 1e-4 : 2e-3;
    ak_status st = scene_run(&ref_sc, "cpu_ref", ref_o, ref_l, bad, sizeof bad);
    const double oracle_err = st == AK_OK ? rel_err_f(ref_o, dense_o, n_o) : INFINITY;
    const double oracle_lse = st == AK_OK ? max_lse_err(ref_l, dense_l, n_l) : INFINITY;
    /* cpu_ref reads the same rounded inputs in fp64: only its output rounding differs */
    const int oracle_ok = st == AK_OK && !bad[0] && oracle_err <= tol && oracle_lse <= 1e-4;
    for (int64_t i = 0; i < n_o; i++) ref_od[i] = ref_o[i];
    for (int64_t i = 0; i < n_l; i++) ref_ld[i] = ref_l[i];

    for (int i = 0; i < nb; i++) {
        const char *name = names[i];
        if (strcmp(name, "cpu_ref") == 0) {
            if (oracle_ok)
                t_pass(t, name, tc->name, "vs dense: rel err %.2e, lse err %.2e", oracle_err, oracle_lse);
            else
                t_fail(t, name, tc->name, "vs dense: status %s %s, rel err %.2e, lse err %.2e %s",
                       ak_status_str(st), st ? ak_last_error() : "", oracle_err, oracle_lse, bad);
            continue;
        }
        if (!oracle_ok) {
            t_fail(t, name, tc->name, "no oracle: cpu_ref disagrees with the dense formula");
            continue;
        }
        scene sc;
        uint64_t rng2 = seed;
        if (scene_build(&sc, tc, t->device, &rng2)) {
            t_fail(t, name, tc->name, "cannot build the scene");
            continue;
        }
        /* Paged cases plan with the block table on the host and, on a GPU,
         * again with it in device memory (batch.device_block_table, read in
         * place); on the CPU, where that table is host memory read like the
         * other, half the cases (by name) take it instead. */
        const int paged = tc->storage == AK_KV_PAGED, gpu = t->device.kind != AK_DEVICE_CPU;
        const int runs = paged && gpu ? 2 : 1;
        for (int run = 0; run < runs; run++) {
            sc.device_table = paged && (gpu ? run == 1 : (int)(scn_name_hash(tc->name) & 1));
            char label[160];
            snprintf(label, sizeof label, "%s%s", tc->name, sc.device_table ? " (device table)" : "");
            st = scene_run(&sc, name, o, l, bad, sizeof bad);
            if (st == AK_ERR_UNSUPPORTED) {
                t_skip(t, name, label, "unsupported");
                break;
            } else if (st != AK_OK) {
                t_fail(t, name, label, "status %s: %s", ak_status_str(st), ak_last_error());
            } else if (bad[0]) {
                t_fail(t, name, label, "%s", bad);
            } else {
                const double e = rel_err_f(o, ref_od, n_o), le = max_lse_err(l, ref_ld, n_l);
                if (e <= tol && le <= lse_tol)
                    t_pass(t, name, label, "rel err %.2e (tol %.0e), lse err %.2e", e, tol, le);
                else
                    t_fail(t, name, label, "rel err %.2e (tol %.0e), lse err %.2e (tol %.0e)", e, tol, le,
                           lse_tol);
            }
        }
        scene_free(&sc);
    }
    scene_free(&ref_sc);
    free(dense_o);
    free(dense_l);
    free(ref_o);
    free(ref_l);
    free(ref_od);
    free(ref_ld);
    free(o);
    free(l);
}

typedef struct case_env_arg {
    test_ctx *t;
    const attn_case *tc;
} case_env_arg;

static void run_case_of(void *arg)
{
    const case_env_arg *a = (const case_env_arg *)arg;
    run_case(a->t, a->tc);
}

void run_case_env(test_ctx *t, const attn_case *tc, const char *var, const char *value)
{
    const case_env_arg a = {t, tc};
    t_with_env(var, value, run_case_of, (void *)&a);
}

/* A sweep case's shape: 2 KV heads of a GQA group, no window. */
static attn_case sweep_case(int head_dim, int group, ak_dtype dtype, int causal)
{
    attn_case tc;
    memset(&tc, 0, sizeof tc);
    tc.num_kv_heads = 2;
    tc.num_qo_heads = 2 * group;
    tc.head_dim_qk = tc.head_dim_vo = head_dim;
    tc.dtype = dtype;
    tc.causal = causal;
    tc.window_left = -1;
    return tc;
}

/* The sweep: head dims x GQA x page sizes x dtypes, each on a decode batch with
 * ragged lengths and on a small prefill/extend batch. */
static void run_sweep(test_ctx *t)
{
    static const int head_dims[] = {64, 80, 96, 112, 128, 192, 256};
    static const int groups[] = {1, 4, 8};
    static const int pages[] = {1, 16, 64};
    static const ak_dtype dtypes[] = {AK_F32, AK_F16, AK_BF16};
    static char names[2][128];
    for (size_t a = 0; a < sizeof head_dims / sizeof *head_dims; a++)
        for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
            for (size_t p = 0; p < sizeof pages / sizeof *pages; p++)
                for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
                    attn_case tc = sweep_case(head_dims[a], groups[g], dtypes[d], 1);
                    tc.page_size = pages[p];
                    tc.layout = (a + p) % 2 ? AK_LAYOUT_HND : AK_LAYOUT_NHD;
                    tc.storage = AK_KV_PAGED;
                    snprintf(names[0], sizeof names[0], "sweep decode d%d g%d p%d %s %s", head_dims[a],
                             groups[g], pages[p], ak_dtype_name(dtypes[d]),
                             tc.layout == AK_LAYOUT_NHD ? "nhd" : "hnd");
                    tc.name = names[0];
                    tc.num_reqs = 4;
                    const req_spec dec[4] = {{1, 1}, {1, 17}, {1, 113}, {1, 1030}};
                    memcpy(tc.reqs, dec, sizeof dec);
                    run_case(t, &tc);

                    snprintf(names[1], sizeof names[1], "sweep extend d%d g%d p%d %s %s", head_dims[a],
                             groups[g], pages[p], ak_dtype_name(dtypes[d]),
                             tc.layout == AK_LAYOUT_NHD ? "nhd" : "hnd");
                    tc.name = names[1];
                    tc.num_reqs = 3;
                    const req_spec ext[3] = {{17, 17}, {40, 113}, {3, 70}};
                    memcpy(tc.reqs, ext, sizeof ext);
                    run_case(t, &tc);
                }
}

/* Ragged K/V: head dims x GQA x 16-bit dtypes on prompt prefills without a
 * prefix (what cuda_varlen is for) and on cross-attention (non-causal, q_len
 * and kv_len unrelated). */
static void run_ragged_sweep(test_ctx *t)
{
    static const int head_dims[] = {64, 128, 256};
    static const int groups[] = {1, 4, 7, 8}; /* (7: tiles packed by warpgroup on Hopper) */
    static const ak_dtype dtypes[] = {AK_F16, AK_BF16};
    static char name[128];
    for (size_t a = 0; a < sizeof head_dims / sizeof *head_dims; a++)
        for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
            for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++)
                for (int cross = 0; cross < 2; cross++) {
                    attn_case tc = sweep_case(head_dims[a], groups[g], dtypes[d], !cross);
                    tc.layout = AK_LAYOUT_NHD;
                    tc.storage = AK_KV_RAGGED;
                    snprintf(name, sizeof name, "sweep ragged %s d%d g%d %s", cross ? "cross" : "prefill",
                             head_dims[a], groups[g], ak_dtype_name(dtypes[d]));
                    tc.name = name;
                    tc.num_reqs = 4;
                    /* 80 tokens: several tiles from group 4 up (ptok <= 32); the
                     * fixed cases hold the longer prompts */
                    const req_spec prefill[4] = {{17, 17}, {80, 80}, {1, 1}, {40, 40}};
                    const req_spec xattn[4] = {{17, 77}, {80, 3}, {1, 0}, {40, 40}};
                    memcpy(tc.reqs, cross ? xattn : prefill, sizeof prefill);
                    run_case(t, &tc);
                }
}

/* A prefill list whose last round is sparse: on a GPU of 132 SMs (H100,
 * H200: 132 prefill blocks) 67 one-tile requests at 8/2 heads make 134 items
 * (a tile a KV head), two past the wave, so the plan cuts the last tile
 * over its keys (2 tokens on 1,034 keys: chunks of 640 and 394) and merges
 * them; elsewhere (another grid, the mma.sync kernel) the same batch is an
 * ordinary one. Short query rows keep the reference cheap. */
static void run_tail_cut(test_ctx *t)
{
    attn_case tc = sweep_case(128, 4, AK_BF16, 1);
    tc.name = "prefill last round cut over its keys bf16 d128 gqa4";
    tc.page_size = 16;
    tc.layout = AK_LAYOUT_NHD;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = 67;
    for (int r = 0; r < tc.num_reqs; r++) {
        tc.reqs[r].q_len = 2 + r % 3;
        tc.reqs[r].kv_len = 1100 - r; /* (the last, the lightest: 1034 keys) */
    }
    run_case(t, &tc);
    tc.name = "prefill last round cut over its keys non-causal f16 d128 gqa4";
    tc.dtype = AK_F16;
    tc.causal = 0;
    run_case(t, &tc);
}

/* AK_CUDA_PREFILL_TMA_SMALL=0 (read at create) sends the Hopper prefill's
 * K/V tiles on pages of 16n keys back to cp.async: the cases below run on
 * that path too, and the backend's description names the boxes, or the
 * switch where it decides; a value other than 0 or 1 is refused, naming the
 * variable. On a GPU only (the CPU backends do not read it). */
typedef struct describe_arg {
    const ak_attn_config *cfg;
    const ak_device_info *dev;
    char *buf;
    size_t cap;
    ak_status described, created;
    char error[256];
} describe_arg;

static void describe_paged(void *arg)
{
    describe_arg *a = (describe_arg *)arg;
    a->described = ak_backend_describe("cuda_paged", a->cfg, a->dev, a->buf, a->cap);
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = 4;
    lim.max_tokens = 256;
    lim.max_blocks_per_req = 64;
    lim.num_cache_blocks = 256;
    ak_backend *b = NULL;
    a->created = ak_backend_create(a->cfg, &lim, "cuda_paged", &b);
    snprintf(a->error, sizeof a->error, "%s", a->created == AK_OK ? "" : ak_last_error());
    ak_backend_destroy(b);
}

/* describe_paged of cfg with var set to value (NULL: unset) for the call */
static void describe_with(const char *var, const char *value, const ak_attn_config *cfg, const ak_device_info *dev,
                          char *buf, size_t cap, describe_arg *d)
{
    memset(d, 0, sizeof *d);
    d->cfg = cfg;
    d->dev = dev;
    d->buf = buf;
    d->cap = cap;
    buf[0] = 0;
    t_with_env(var, value, describe_paged, d);
}

/* The configuration the selector tests describe: bf16, 8/2 heads of 128,
 * on the test's device, pages of page_size keys */
static ak_attn_config gqa4_bf16_d128(const test_ctx *t, int page_size)
{
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.device = t->device;
    cfg.num_qo_heads = 8;
    cfg.num_kv_heads = 2;
    cfg.head_dim_qk = cfg.head_dim_vo = 128;
    cfg.page_size = page_size;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = AK_BF16;
    return cfg;
}

static void run_page_boxes_off(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CUDA) return;
    attn_case tc = sweep_case(128, 4, AK_BF16, 1);
    tc.name = "prefill page 16 K/V by cp.async (AK_CUDA_PREFILL_TMA_SMALL=0) bf16 d128 gqa4";
    tc.page_size = 16;
    tc.layout = AK_LAYOUT_NHD;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = 3;
    const req_spec reqs[3] = {{300, 300}, {77, 610}, {1, 45}};
    memcpy(tc.reqs, reqs, sizeof reqs);
    run_case_env(t, &tc, "AK_CUDA_PREFILL_TMA_SMALL", "0");
    tc.name = "prefill page 32 K/V by cp.async (AK_CUDA_PREFILL_TMA_SMALL=0) f16 d96 hnd";
    tc.head_dim_qk = tc.head_dim_vo = 96;
    tc.dtype = AK_F16;
    tc.page_size = 32;
    tc.layout = AK_LAYOUT_HND;
    run_case_env(t, &tc, "AK_CUDA_PREFILL_TMA_SMALL", "0");

    const char *name = "the Hopper prefill's description names its K/V boxes and AK_CUDA_PREFILL_TMA_SMALL";
    if (!t_selected(t, name) || (t->backend && strcmp(t->backend, "cuda_paged") != 0) ||
        !t_storage_selected(t, AK_KV_PAGED))
        return;
    const char *tma = getenv("AK_CUDA_PREFILL_TMA");
    if (tma && *tma && strcmp(tma, "1") != 0) {
        t_skip(t, NULL, name, "AK_CUDA_PREFILL_TMA=%s turns every TMA copy off", tma);
        return;
    }
    ak_device_info dev;
    if (ak_device_get_info(t->device, &dev) != AK_OK || dev.cc_major != 9) {
        t_skip(t, NULL, name, "not a GPU of compute capability 9.0");
        return;
    }
    char buf[4][1024], bad[1024];
    describe_arg d[4], e;
    const int pages[4] = {16, 16, 32, 128};
    const char *env[4] = {NULL, "0", NULL, "0"};
    for (int i = 0; i < 4; i++) {
        const ak_attn_config c = gqa4_bf16_d128(t, pages[i]);
        describe_with("AK_CUDA_PREFILL_TMA_SMALL", env[i], &c, &dev, buf[i], sizeof buf[i], &d[i]);
    }
    if (d[0].described != AK_OK) {
        CHECK(t, name, 0, "cuda_paged cannot describe a bf16 d128 prefill on this GPU: %s", buf[0]);
        return;
    }
    if (!strstr(buf[0], "wgmma")) {
        t_skip(t, NULL, name, "no wgmma prefill here (a build without sm_90a, AK_CUDA_PREFILL=mma or "
                              "AK_CUDA_PORTABLE=1): %s", buf[0]);
        return;
    }
    const ak_attn_config c = gqa4_bf16_d128(t, 16);
    describe_with("AK_CUDA_PREFILL_TMA_SMALL", "yes", &c, &dev, bad, sizeof bad, &e);
    int ok = 1;
    for (int i = 0; i < 4; i++) ok &= d[i].described == AK_OK && d[i].created == AK_OK;
    ok &= strstr(buf[0], "boxes of 16 keys") != NULL && strstr(buf[2], "boxes of 32 keys") != NULL;
    ok &= strstr(buf[1], "K/V by cp.async (AK_CUDA_PREFILL_TMA_SMALL=0)") != NULL;
    /* pages of 128 keys take a tile's box whatever the switch says */
    ok &= strstr(buf[3], "TMA") != NULL && strstr(buf[3], "TMA_SMALL") == NULL && strstr(buf[3], "boxes of") == NULL;
    ok &= e.created == AK_ERR_INVALID_ARG && strstr(e.error, "AK_CUDA_PREFILL_TMA_SMALL=yes") != NULL &&
          strstr(bad, "AK_CUDA_PREFILL_TMA_SMALL=yes") != NULL;
    CHECK(t, name, ok, "page 16: %s | off: %s | page 32: %s | page 128 off: %s | =yes: %s / %s (%s)", buf[0], buf[1],
          buf[2], buf[3], ak_status_str(e.created), e.error, bad);
}

/* AK_CUDA_PREFILL=mma|wgmma forces the prefill family (engine.cu's
 * choose_prefill): mma is taken on any GPU the tensor-core kernels run on,
 * wgmma on compute capability 9.0 with a build for sm_90a and 16-bit K/V,
 * and a force that cannot hold (fp8 K/V, which the wgmma kernel has no
 * instance for) or a value that is neither is refused at create, naming
 * the variable, never ignored. */
static void run_prefill_force(test_ctx *t)
{
    const char *name = "AK_CUDA_PREFILL forces a prefill family; an impossible or unknown value is refused";
    if (t->device.kind != AK_DEVICE_CUDA || !t_selected(t, name) ||
        (t->backend && strcmp(t->backend, "cuda_paged") != 0) || !t_storage_selected(t, AK_KV_PAGED))
        return;
    const char *portable = getenv("AK_CUDA_PORTABLE");
    if (portable && *portable && strcmp(portable, "0") != 0) {
        t_skip(t, NULL, name, "AK_CUDA_PORTABLE=%s sends every prefill to the portable kernel", portable);
        return;
    }
    ak_device_info dev;
    if (ak_device_get_info(t->device, &dev) != AK_OK || dev.cc_major < 8) {
        t_skip(t, NULL, name, "no GPU of compute capability 8.0 or later");
        return;
    }
    const ak_attn_config cfg = gqa4_bf16_d128(t, 128);
    ak_attn_config fp8 = cfg;
    fp8.kv_dtype = AK_FP8_E4M3;
    enum { MMA, WGMMA, FP8_WGMMA, FP8_MMA, UNKNOWN, N };
    const ak_attn_config *cfgs[N] = {&cfg, &cfg, &fp8, &fp8, &cfg};
    const char *value[N] = {"mma", "wgmma", "wgmma", "mma", "simd"};
    char buf[N][1024];
    describe_arg d[N];
    for (int i = 0; i < N; i++) describe_with("AK_CUDA_PREFILL", value[i], cfgs[i], &dev, buf[i], sizeof buf[i], &d[i]);
    /* wgmma runs where the unforced choice takes it: cc 9.0 and a build
     * with the kernel (the default description names it then) */
    char unforced[1024];
    describe_arg u;
    describe_with("AK_CUDA_PREFILL", NULL, &cfg, &dev, unforced, sizeof unforced, &u);
    const int wg = dev.cc_major == 9 && dev.cc_minor == 0 && strstr(unforced, "wgmma") != NULL;
    int ok = d[MMA].created == AK_OK && strstr(buf[MMA], "mma.sync") != NULL && strstr(buf[MMA], "wgmma") == NULL;
    ok &= d[FP8_MMA].created == AK_OK && strstr(buf[FP8_MMA], "mma.sync") != NULL;
    if (wg)
        ok &= d[WGMMA].created == AK_OK && strstr(buf[WGMMA], "wgmma") != NULL;
    else
        ok &= d[WGMMA].created == AK_ERR_UNSUPPORTED && strstr(d[WGMMA].error, "AK_CUDA_PREFILL=wgmma") != NULL;
    ok &= d[FP8_WGMMA].created == AK_ERR_UNSUPPORTED && strstr(d[FP8_WGMMA].error, "AK_CUDA_PREFILL=wgmma") != NULL &&
          strstr(d[FP8_WGMMA].error, "fp8") != NULL && strstr(buf[FP8_WGMMA], "AK_CUDA_PREFILL=wgmma") != NULL;
    ok &= d[UNKNOWN].created == AK_ERR_INVALID_ARG && strstr(d[UNKNOWN].error, "AK_CUDA_PREFILL=simd") != NULL;
    CHECK(t, name, ok, "mma: %s (%s) | wgmma%s: %s / %s | fp8 wgmma: %s / %s | fp8 mma: %s (%s) | simd: %s / %s",
          ak_status_str(d[MMA].created), buf[MMA], wg ? " (runs here)" : " (cannot run here)",
          ak_status_str(d[WGMMA].created), d[WGMMA].created == AK_OK ? buf[WGMMA] : d[WGMMA].error,
          ak_status_str(d[FP8_WGMMA].created), d[FP8_WGMMA].error, ak_status_str(d[FP8_MMA].created), buf[FP8_MMA],
          ak_status_str(d[UNKNOWN].created), d[UNKNOWN].error);
}

/* The Hopper prefill finds non-finite inputs itself (attn.cuh's "NaN rule
 * found in the kernel"), and its description says so; AK_CUDA_NAN_DETECT=0
 * keeps the scan pass, as a window does (the last token's rows no longer see
 * every key); any other value is refused at create, naming the variable.
 * (That both paths give the rule's rows: test_nonfinite.c, whose scan
 * variants run with the switch at 0.) */
static void run_nan_detect_switch(test_ctx *t)
{
    const char *name = "the Hopper prefill finds non-finite inputs itself; AK_CUDA_NAN_DETECT=0 or a window keeps "
                       "the scan pass; an unknown value is refused";
    if (t->device.kind != AK_DEVICE_CUDA || !t_selected(t, name) ||
        (t->backend && strcmp(t->backend, "cuda_paged") != 0) || !t_storage_selected(t, AK_KV_PAGED))
        return;
    ak_device_info dev;
    if (ak_device_get_info(t->device, &dev) != AK_OK || dev.cc_major != 9) {
        t_skip(t, NULL, name, "not a GPU of compute capability 9.0");
        return;
    }
    const ak_attn_config cfg = gqa4_bf16_d128(t, 128);
    ak_attn_config win = cfg;
    win.window_left = 256;
    enum { ON, OFF, WINDOW, UNKNOWN, N };
    const ak_attn_config *cfgs[N] = {&cfg, &cfg, &win, &cfg};
    const char *value[N] = {NULL, "0", NULL, "yes"};
    char buf[N][1024];
    describe_arg d[N];
    for (int i = 0; i < N; i++)
        describe_with("AK_CUDA_NAN_DETECT", value[i], cfgs[i], &dev, buf[i], sizeof buf[i], &d[i]);
    if (!strstr(buf[ON], "wgmma")) {
        t_skip(t, NULL, name, "no wgmma prefill here (a build without sm_90a, AK_CUDA_PREFILL=mma or "
                              "AK_CUDA_PORTABLE=1): %s", buf[ON]);
        return;
    }
    const char *found = "found by the kernel itself", *scan = "a scan pass first for";
    int ok = d[ON].created == AK_OK && strstr(buf[ON], found) && !strstr(buf[ON], scan);
    ok &= d[OFF].created == AK_OK && strstr(buf[OFF], scan) && !strstr(buf[OFF], found);
    ok &= d[WINDOW].created == AK_OK && strstr(buf[WINDOW], scan) && !strstr(buf[WINDOW], found);
    ok &= d[UNKNOWN].created == AK_ERR_INVALID_ARG && strstr(d[UNKNOWN].error, "AK_CUDA_NAN_DETECT=yes") != NULL &&
          strstr(buf[UNKNOWN], "AK_CUDA_NAN_DETECT=yes") != NULL;
    CHECK(t, name, ok, "unset: %s | 0: %s | window: %s | yes: %s / %s (%s)", buf[ON], buf[OFF], buf[WINDOW],
          ak_status_str(d[UNKNOWN].created), d[UNKNOWN].error, buf[UNKNOWN]);
}

void test_attn_cases(test_ctx *t)
{
    for (size_t i = 0; i < sizeof fixed_cases / sizeof *fixed_cases; i++) run_case(t, &fixed_cases[i]);
    run_sweep(t);
    run_ragged_sweep(t);
    run_tail_cut(t);
    run_page_boxes_off(t);
    run_prefill_force(t);
    run_nan_detect_switch(t);
}
