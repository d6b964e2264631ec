"""
test_cli.py - `python -m attnkit`, attnkit-info through the binding. With
ATTNKIT_INFO naming an attnkit-info binary built with the library under test
(ctest sets it), both must print the same and exit the same; without it, the
form of the output is checked.
"""
import os
import re
import subprocess
import sys
import unittest

import attnkit

CASES = ([], ["--device", "cpu", "--heads", "8/2", "--head-dim", "64", "--dtype", "bf16"],
         ["--ragged", "--workload", "decode"], ["--device", "cuda"], ["--version"],
         ["--heads", "3"], ["--bogus"], ["--matrix"], ["--sinks", "--invariant", "--window", "127"],
         ["--kv-dtype", "fp8_e4m3"], ["--dtype", "f16", "--kv-dtype", "fp8_e4m3", "--device", "cuda"])


def _env():
    """The environment in which a child process imports this attnkit and its library."""
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(attnkit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    if os.sep in attnkit.library_path:
        env["ATTNKIT_LIB"] = attnkit.library_path
    return env


def run(cmd, **env):
    """cmd's exit status and output, with env's variables set (None: unset)."""
    full = _env()
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=60)


class TestMain(unittest.TestCase):
    def test_version(self):
        p = run([sys.executable, "-m", "attnkit", "--version"])
        self.assertEqual((p.returncode, p.stdout), (0, f"attnkit {attnkit.__version__}\n"))
        major, minor, patch = (int(x) for x in attnkit.__version__.split("."))
        self.assertEqual(attnkit.version(), major * 10000 + minor * 100 + patch)

    def test_output(self):
        p = run([sys.executable, "-m", "attnkit", "--device", "cpu"])
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(lines[0], "devices:")
        self.assertTrue(lines[1].startswith("  cpu:0  "), lines[1])
        self.assertIn("config: heads 32/8, head_dim 128/128", p.stdout)
        self.assertRegex(p.stdout, r"\n  cpu +chosen")
        p = run([sys.executable, "-m", "attnkit", "--heads", "3"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage: python -m attnkit", p.stderr)

    def test_cpu_kernel_line(self):
        """The device line names the kernel the cpu backend says it runs."""
        for isa in (None, "scalar"):
            for dtype in ("f32", "bf16"):
                with self.subTest(isa=isa, dtype=dtype):
                    p = run([sys.executable, "-m", "attnkit", "--device", "cpu", "--dtype", dtype],
                            AK_CPU_ISA=isa, AK_BACKEND=None)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    m = re.search(r"\n  cpu:0  .*, cpu kernel: (\S+) \(", p.stdout)
                    self.assertTrue(m, p.stdout)
                    self.assertRegex(p.stdout, rf"\n  cpu +chosen - {re.escape(m.group(1))} kernels")
                    if isa:
                        self.assertEqual(m.group(1), isa)

    @unittest.skipUnless(os.environ.get("ATTNKIT_INFO"), "ATTNKIT_INFO names no attnkit-info")
    def test_same_as_attnkit_info(self):
        for args in CASES:
            with self.subTest(args=args):
                c = run([os.environ["ATTNKIT_INFO"], *args])
                p = run([sys.executable, "-m", "attnkit", *args])
                self.assertEqual((p.returncode, p.stdout), (c.returncode, c.stdout))


if __name__ == "__main__":
    unittest.main()
