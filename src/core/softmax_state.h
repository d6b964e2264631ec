/*
 * softmax_state.h - the attention softmax state and its merge algebra, as the
 * host code uses it: the cpu backend's merge of split-KV partials and
 * ak_merge_states. cpu_ref computes the same thing in fp64 by its own plain
 * formula, and the CUDA kernels keep the same algebra inline in base 2
 * (logits pre-multiplied by log2 e, so exp2 is one instruction: decode.cu's
 * fold_max, the prefill kernels' online softmax, merge.cu), converting LSE to
 * the natural log where they write it.
 *
 * While streaming over keys, a query row keeps {m, d, o}: m the running max of
 * the logits, d = sum exp(logit - m), o = sum exp(logit - m) * v (unnormalised).
 * A finished part is summarised by its normalised output o / d and its
 * log-sum-exp lse = m + log(d) (natural log). Two parts merge exactly:
 *     lse = log(exp(lse_a) + exp(lse_b)),  o = w_a * o_a + w_b * o_b,
 *     w_x = exp(lse_x - lse).
 * An empty part has lse = -inf and weight 0; if every part is empty the merged
 * row is o = 0, lse = -inf (never NaN). A NaN never vanishes: a NaN lse makes
 * the merged lse NaN whatever the order of the parts, and a state whose d is
 * NaN has lse NaN (the rule of attnkit.h: corrupted input is never hidden).
 */
#ifndef AK_SOFTMAX_STATE_H
#define AK_SOFTMAX_STATE_H

#include "hostdev.h"

#include <math.h>

/* log(exp(a) + exp(b)), correct when either or both are -inf; NaN when
 * either is NaN or +inf, in either position (fmaxf alone drops a NaN, so
 * which part was NaN decided whether the sum was). */
AK_HD float ak_lse_add(float a, float b)
{
    if (isnan(a) || isnan(b)) return a + b;
    const float mx = fmaxf(a, b);
    if (mx == -INFINITY) return -INFINITY;
    return mx + logf(expf(a - mx) + expf(b - mx));
}

/* Weight of a part with log-sum-exp lse_part in a whole with lse_total. */
AK_HD float ak_lse_weight(float lse_part, float lse_total)
{
    return lse_total == -INFINITY ? 0.0f : expf(lse_part - lse_total);
}

/* One online-softmax step: fold a new running max in. Returns the factor by
 * which the old d and o must be scaled (0 when the old max was -inf). */
AK_HD float ak_rescale_factor(float m_old, float m_new)
{
    return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

/* Final lse of a state {m, d}: -inf when it saw no key (d = 0), NaN when d
 * is NaN. */
AK_HD float ak_state_lse(float m, float d)
{
    return d == 0.0f ? -INFINITY : m + logf(d);
}

/* The end of a row whose online softmax finished with running max m and sum
 * d = sum exp(logit - m) (m need not be the exact max): the factor the
 * unnormalised o is multiplied by, and the row's lse. sink is the row's sink
 * logit (attnkit.h, cfg.use_sinks), which joins the denominator with no
 * value, or -inf for none; the larger of m and sink is the reference, so
 * neither exp overflows. A row that saw no key: o = 0, lse = sink. */
AK_HD void ak_state_finish(float m, float d, float sink, float *inv, float *lse)
{
    if (sink == -INFINITY) {
        *inv = d > 0.0f ? 1.0f / d : 0.0f;
        *lse = ak_state_lse(m, d);
        return;
    }
    const float top = d > 0.0f && m > sink ? m : sink;
    const float w = d > 0.0f ? expf(m - top) : 0.0f; /* the keys' share, in the frame of top */
    const float den = d * w + expf(sink - top);
    *inv = w / den;
    *lse = top + logf(den);
}

#endif /* AK_SOFTMAX_STATE_H */
