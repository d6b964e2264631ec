/*
 * softmax_state.h - the one attention softmax state, shared by every backend
 * (C and CUDA), by the merge of split-KV partials and by ak_merge_states.
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

#include <math.h>

#if defined(__CUDACC__)
#define AK_SM_HD __host__ __device__ __forceinline__
#else
#define AK_SM_HD static inline
#endif

/* log(exp(a) + exp(b)), correct when either or both are -inf; NaN when
 * either is NaN or +inf, in either position (fmaxf alone drops a NaN, so
 * which part was NaN decided whether the sum was). */
AK_SM_HD float ak_lse_add(float a, float b)
{
    if (isnan(a) || isnan(b)) return a + b;
    const float mx = fmaxf(a, b);
    if (mx == -INFINITY) return -INFINITY;
    return mx + logf(expf(a - mx) + expf(b - mx));
}

/* Weight of a part with log-sum-exp lse_part in a whole with lse_total. */
AK_SM_HD float ak_lse_weight(float lse_part, float lse_total)
{
    return lse_total == -INFINITY ? 0.0f : expf(lse_part - lse_total);
}

/* One online-softmax step: fold a new running max in. Returns the factor by
 * which the old d and o must be scaled (0 when the old max was -inf). */
AK_SM_HD float ak_rescale_factor(float m_old, float m_new)
{
    return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

/* Final lse of a state {m, d}: -inf when it saw no key (d = 0), NaN when d
 * is NaN. */
AK_SM_HD float ak_state_lse(float m, float d)
{
    return d == 0.0f ? -INFINITY : m + logf(d);
}

#endif /* AK_SOFTMAX_STATE_H */
