"""
test_marks.py - finiteness marks (attnkit.h, ak_paged_kv.marks) through the
binding: kv_marks_words, kv_update setting a slot's bit for a NaN or an
infinity in its K or V row and clearing it for a finite rewrite (every other
bit left as it was), run() taking the marks beside the cache, and a wrong
marks buffer refused with an error naming it. Standard library only.
"""
import array
import math
import random
import unittest

import attnkit

HQ, HK, D, PAGE, BLOCKS = 4, 2, 8, 40, 3  # pages of 40 slots: two words a (block, head)


class TestMarks(unittest.TestCase):
    def setUp(self):
        self.words = attnkit.kv_marks_words(BLOCKS, HK, PAGE)
        self.k_cache = array.array("f", [0.0] * (BLOCKS * PAGE * HK * D))
        self.v_cache = array.array("f", [0.0] * (BLOCKS * PAGE * HK * D))
        rng = random.Random(7)
        # poisoned with random bits: the bits of slots never written keep them
        self.marks = array.array("i", (rng.randrange(-2 ** 31, 2 ** 31) for _ in range(self.words)))
        self.cache = (attnkit.View(self.k_cache, (BLOCKS, PAGE, HK, D)),
                      attnkit.View(self.v_cache, (BLOCKS, PAGE, HK, D)))

    def bit(self, slot, head):
        b, s = divmod(slot, PAGE)
        return (self.marks[(b * HK + head) * 2 + s // 32] >> (s % 32)) & 1

    def write(self, slots, bad):
        """kv_update of len(slots) tokens of 0.5, with bad[(token, head)] = (is_v, value)."""
        k = array.array("f", [0.5] * (len(slots) * HK * D))
        v = array.array("f", [0.5] * (len(slots) * HK * D))
        for (j, h), (is_v, x) in bad.items():
            (v if is_v else k)[(j * HK + h) * D + 3] = x
        n = len(slots)
        attnkit.kv_update(*self.cache, attnkit.View(k, (n, HK, D)), attnkit.View(v, (n, HK, D)), slots,
                          marks=attnkit.View(self.marks, (self.words,)))

    def test_words(self):
        self.assertEqual(self.words, BLOCKS * HK * 2)
        self.assertEqual(attnkit.kv_marks_words(1, 1, 32), 1)
        self.assertEqual(attnkit.kv_marks_words(1, 1, 33), 2)
        with self.assertRaises(attnkit.InvalidArgument):
            attnkit.kv_marks_words(0, 1, 16)

    def test_kv_update_sets_and_clears(self):
        before = list(self.marks)
        slots = [5, 70, 41, 119]  # block 0 slot 5, block 1 slots 30 and 1, block 2 slot 39 (second word)
        bad = {(1, 1): (0, math.inf), (2, 0): (1, math.nan), (3, 1): (1, -math.inf)}
        self.write(slots, bad)
        for j, slot in enumerate(slots):
            for h in range(HK):
                self.assertEqual(self.bit(slot, h), int((j, h) in bad), f"slot {slot} head {h}")
        written = {(s // PAGE, h, (s % PAGE) // 32) for s in slots for h in range(HK)}
        for b in range(BLOCKS):
            for h in range(HK):
                for w in range(2):
                    i = (b * HK + h) * 2 + w
                    if (b, h, w) not in written:
                        self.assertEqual(self.marks[i], before[i], f"word {i} was not written")
        self.write(slots, {})  # the same slots rewritten finite
        for slot in slots:
            for h in range(HK):
                self.assertEqual(self.bit(slot, h), 0, f"slot {slot} head {h} after a finite rewrite")

    def test_run_takes_marks(self):
        rng = random.Random(3)
        L = 30
        slots = list(range(PAGE, PAGE + L))  # block 1
        k = array.array("f", (rng.uniform(-1, 1) for _ in range(L * HK * D)))
        v = array.array("f", (rng.uniform(-1, 1) for _ in range(L * HK * D)))
        marks = attnkit.View(self.marks, (self.words,))
        attnkit.kv_update(*self.cache, attnkit.View(k, (L, HK, D)), attnkit.View(v, (L, HK, D)), slots, marks=marks)
        q = array.array("f", (rng.uniform(-1, 1) for _ in range(HQ * D)))
        cfg = attnkit.Config(num_qo_heads=HQ, num_kv_heads=HK, head_dim=D, page_size=PAGE, q_dtype="f32",
                             kv_dtype="f32", o_dtype="f32", workload="decode")
        lim = attnkit.Limits(max_reqs=1, max_tokens=1, max_blocks_per_req=2, num_cache_blocks=BLOCKS)
        outs = []
        for use in (None, marks):
            with attnkit.Backend(cfg, lim, name="cpu_ref") as b:
                o = array.array("f", [math.nan] * (HQ * D))
                b.plan([0, 1], [L], [[1]])
                b.run(attnkit.View(q, (1, HQ, D)), *self.cache, attnkit.View(o, (1, HQ, D)), marks=use)
                outs.append(list(o))
        self.assertTrue(all(math.isfinite(x) for x in outs[0]))
        self.assertEqual(outs[0], outs[1])
        # Backend.kv_update at the planned slot (the request's last key: block 1, slot L - 1)
        with attnkit.Backend(cfg, lim, name="cpu_ref") as b:
            b.plan([0, 1], [L], [[1]])
            one = array.array("f", [0.25] * (HK * D))
            bad = array.array("f", [0.25] * (HK * D))
            bad[D + 2] = math.nan  # head 1's K row
            b.kv_update(*self.cache, attnkit.View(bad, (1, HK, D)), attnkit.View(one, (1, HK, D)), marks=marks)
            self.assertEqual((self.bit(PAGE + L - 1, 0), self.bit(PAGE + L - 1, 1)), (0, 1))
            b.kv_update(*self.cache, attnkit.View(one, (1, HK, D)), attnkit.View(one, (1, HK, D)), marks=marks)
            self.assertEqual((self.bit(PAGE + L - 1, 0), self.bit(PAGE + L - 1, 1)), (0, 0))

    def test_wrong_marks(self):
        k = attnkit.View(array.array("f", [0.5] * (HK * D)), (1, HK, D))
        short = attnkit.View(array.array("i", [0] * (self.words - 1)), (self.words - 1,))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.kv_update(*self.cache, k, k, [3], marks=short)
        self.assertIn("marks", str(cm.exception))
        floats = attnkit.View(array.array("f", [0.0] * self.words), (self.words,))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.kv_update(*self.cache, k, k, [3], marks=floats)
        self.assertIn("marks", str(cm.exception))
        self.assertEqual(self.k_cache[3 * HK * D], 0.0, "a refused kv_update wrote the cache")


if __name__ == "__main__":
    unittest.main()
