/*
 * visible.h - which keys a query sees: the one definition of the causal,
 * window and end-of-keys rule for the fast backends, their planners and the
 * CUDA kernels' masks (cpu_ref keeps its own on purpose: it is the oracle).
 *
 * The q_len new tokens of a request sit at positions kv_len - q_len ..
 * kv_len - 1. The query at position pos sees the keys j with
 *     ak_visible_lo(pos, window_left) <= j <= ak_visible_hi(pos, kv_len, causal)
 * (empty when lo > hi). Both bounds grow with pos, so a tile of consecutive
 * queries sees [lo(first), hi(last)] and each of its rows a part of it. A
 * chunk of the keys [kv_begin, kv_end) is masked with kv_end as kv_len.
 */
#ifndef AK_VISIBLE_H
#define AK_VISIBLE_H

#include "hostdev.h"

/* The first key the query at pos sees: pos - window_left, or 0 (full window:
 * window_left = -1). */
AK_HD int ak_visible_lo(int pos, int window_left)
{
    /* pos > window_left, not pos - window_left > 0: pos is negative for a
     * non-causal query past its keys, and pos - window_left would overflow */
    return window_left >= 0 && pos > window_left ? pos - window_left : 0;
}

/* The last key the query at pos sees among kv_len: pos when causal, else the
 * last key. */
AK_HD int ak_visible_hi(int pos, int kv_len, int causal)
{
    return causal && pos < kv_len - 1 ? pos : kv_len - 1;
}

#endif /* AK_VISIBLE_H */
