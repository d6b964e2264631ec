"""
test_cli.py - `python -m attnkit`, attnkit-info through the binding. With
ATTNKIT_INFO naming an attnkit-info binary built with the library under test
(ctest sets it), both must print the same and exit the same; without it, the
form of the output is checked. With ATTNKIT_BENCH naming attnkit-bench (ctest
sets it), its command line too: --help, usage errors.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

import attnkit

CASES = ([], ["--device", "cpu", "--heads", "8/2", "--head-dim", "64", "--dtype", "bf16"],
         ["--ragged", "--workload", "decode"], ["--device", "cuda"], ["--version"],
         ["--heads", "3"], ["--bogus"], ["--matrix"], ["--sinks", "--invariant", "--window", "127"],
         ["--kv-dtype", "fp8_e4m3"], ["--dtype", "f16", "--kv-dtype", "fp8_e4m3", "--device", "cuda"],
         ["--mla", "--dtype", "bf16", "--page-size", "64"], ["--mla", "--heads", "16/2"],
         ["--mla", "--device", "cuda"])


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

    def info_commands(self):
        """python -m attnkit, and attnkit-info where ATTNKIT_INFO names it."""
        cmds = [[sys.executable, "-m", "attnkit"]]
        if os.environ.get("ATTNKIT_INFO"):
            cmds.append([os.environ["ATTNKIT_INFO"]])
        return cmds

    def test_help(self):
        for cmd in self.info_commands():
            for flag in ("--help", "-h"):
                with self.subTest(cmd=cmd[-1], flag=flag):
                    p = run([*cmd, flag])
                    self.assertEqual((p.returncode, p.stderr), (0, ""))
                    self.assertTrue(p.stdout.startswith("usage: "), p.stdout)
                    self.assertIn("--matrix", p.stdout)
            with self.subTest(cmd=cmd[-1], usage_error="--bogus"):
                p = run([*cmd, "--bogus"])
                self.assertEqual((p.returncode, p.stdout), (2, ""))
                self.assertTrue(p.stderr.startswith("usage: "), p.stderr)

    def test_bad_values(self):
        """A value that is not what the option takes: exit 2, the option named, never a wrapped or default value."""
        bad = [("--heads", "4294967328/32"), ("--heads", "32/8junk"), ("--heads", "32"),
               ("--head-dim", "4294967424"), ("--head-dim", "128/64/32"), ("--page-size", "99999999999"),
               ("--page-size", "abc"), ("--window", "abc"), ("--device", "gpu"), ("--layout", "xyz"),
               ("--soft-cap", "1e99"), ("--soft-cap", ""), ("--heads", "\uff13\uff12/8")]
        for cmd in self.info_commands():
            for opt, value in bad:
                with self.subTest(cmd=cmd[-1], opt=opt, value=value):
                    p = run([*cmd, "--device", "cpu", opt, value])
                    self.assertEqual((p.returncode, p.stdout), (2, ""))
                    self.assertTrue(p.stderr.startswith(f"{opt} '{value}': expected "), p.stderr)

    def test_values_read_as_c_reads_them(self):
        """strtof's hexadecimal floats and values that round to FLT_MAX; strtol's leading blanks."""
        for cmd in self.info_commands():
            for args in (["--soft-cap", "0x10"], ["--soft-cap", "3.4028235e38"], ["--heads", " 32/ 8"]):
                with self.subTest(cmd=cmd[-1], args=args):
                    p = run([*cmd, "--device", "cpu", *args])
                    self.assertEqual((p.returncode, p.stderr), (0, ""))

    def test_bad_override(self):
        """AK_BACKEND=nope: the backends listed once (in the explanation), the
        error in one line; a misspelt name gets the closest one."""
        for cmd in self.info_commands():
            with self.subTest(cmd=cmd[-1]):
                p = run([*cmd, "--device", "cpu"], AK_BACKEND="nope")
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertEqual(len(re.findall(r"^  cpu_ref +available", p.stdout + p.stderr, re.M)), 1,
                                 p.stdout + p.stderr)
                self.assertRegex(p.stderr, r"^\n[^\n]*: no such backend: AK_BACKEND=nope names no backend\n$")
                self.assertNotIn("did you mean", p.stderr)
                p = run([*cmd, "--device", "cpu"], AK_BACKEND="cpu_rf")
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("AK_BACKEND=cpu_rf names no backend (did you mean cpu_ref?)", p.stderr)

    @unittest.skipUnless(os.environ.get("ATTNKIT_INFO"), "ATTNKIT_INFO names no attnkit-info")
    def test_same_as_attnkit_info(self):
        for args in CASES:
            with self.subTest(args=args):
                c = run([os.environ["ATTNKIT_INFO"], *args])
                p = run([sys.executable, "-m", "attnkit", *args])
                self.assertEqual((p.returncode, p.stdout), (c.returncode, c.stdout))


@unittest.skipUnless(os.environ.get("ATTNKIT_BENCH"), "ATTNKIT_BENCH names no attnkit-bench")
class TestBench(unittest.TestCase):
    """attnkit-bench's command line (nothing here runs a benchmark)."""

    def bench(self, *args, **env):
        return run([os.environ["ATTNKIT_BENCH"], *args], **env)

    def test_help(self):
        for flag in ("--help", "-h"):
            with self.subTest(flag=flag):
                p = self.bench(flag)
                self.assertEqual((p.returncode, p.stderr), (0, ""))
                self.assertTrue(p.stdout.startswith("usage: attnkit-bench"), p.stdout)
                self.assertIn("--workload", p.stdout)

    def test_usage_errors(self):
        """One line on stderr naming the bad argument, nothing on stdout, exit 2."""
        cases = {("--bogus",): "'--bogus'", ("--batch",): "--batch", ("--batch", "x"): "'x'",
                 ("--workload", "foo"): "'foo'", ("--device", "gpu"): "'gpu'", ("--seed", "1x"): "'1x'",
                 ("--heads", "6/4"): "6/4", ("--workload", "decode", "--q-len", "4"): "--q-len 4",
                 ("--compare", "paged,nope"): "paged,nope", ("--backend",): "--backend"}
        for args, named in cases.items():
            with self.subTest(args=args):
                p = self.bench(*args)
                self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
                self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
                self.assertTrue(p.stderr.startswith("attnkit-bench: "), p.stderr)
                self.assertIn(named, p.stderr)
                self.assertTrue(p.stderr.endswith(" (attnkit-bench --help lists the options)\n"), p.stderr)

    def test_misspelt_backend(self):
        p = self.bench("--backend", "cpu_rf", "--device", "cpu", "--workload", "decode", "--batch", "2",
                       "--kv-len", "64")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("skipped: no backend is named cpu_rf (did you mean cpu_ref?); the backends are cpu, cpu_ref",
                      p.stdout)

    # a tiny decode: ~2 s, most of it the ceiling's streaming read
    TINY = ("--workload", "decode", "--batch", "2", "--kv-len", "64", "--layers", "2", "--iters", "3")

    def test_default_device(self):
        """Without --device: the GPU if found; a CUDA build without one says it runs on the CPU."""
        p = self.bench(*self.TINY, AK_BACKEND=None)
        self.assertEqual(p.returncode, 0, p.stderr)
        says = "attnkit-bench: no CUDA device; running on the CPU\n"
        cuda_build = any(name.startswith("cuda") for name in attnkit.backends())
        if cuda_build and attnkit.device_count("cuda") == 0:
            self.assertIn(says, p.stderr)
        else:
            self.assertNotIn(says, p.stderr)
        p = self.bench(*self.TINY, "--device", "cpu")
        self.assertNotIn(says, p.stderr)

    def test_cpu_ref_default_shape(self):
        """cpu_ref with no shape options: the workload's default is cut, and a note says so."""
        p = self.bench("--workload", "decode", "--json", "--iters", "1", "--layers", "1", AK_BACKEND="cpu_ref")
        self.assertEqual(p.returncode, 0, p.stderr)
        row = json.loads(p.stdout.splitlines()[-1])
        self.assertEqual((row["backend"], row["batch"], row["kv_len"]), ("cpu_ref", 16, 1024))
        self.assertIn("# cpu_ref, the fp64 reference, runs ~0.3 GFLOP/s: the decode default is cut to", p.stderr)
        p = self.bench(*self.TINY, "--json", AK_BACKEND="cpu_ref")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout.splitlines()[-1])["batch"], 2)
        self.assertNotIn("default is cut", p.stderr)

    def test_ceiling_warning(self):
        """A row above its bandwidth ceiling (frac > 1) gets a warning, and only such a row. The
        shape's 17 MB of K/V fit this VM's last-level cache, so that frac is likely above 1 here."""
        p = self.bench("--workload", "decode", "--batch", "8", "--kv-len", "256", "--layers", "1", "--iters", "5",
                       "--backend", "cpu", "--device", "cpu", "--json", AK_NUM_THREADS="1")
        self.assertEqual(p.returncode, 0, p.stderr)
        row = json.loads(p.stdout.splitlines()[-1])
        warned = re.search(r"^# cpu: frac [0-9.]+ > 1, faster than the stream_read ceiling", p.stderr, re.M)
        self.assertEqual(bool(warned), row["ceiling_fraction"] > 1, p.stderr)


GPU_CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu-check.sh")


@unittest.skipUnless(os.path.isfile(GPU_CHECK) and shutil.which("bash"), "no scripts/gpu-check.sh or no bash")
class TestGpuCheck(unittest.TestCase):
    """scripts/gpu-check.sh's command line: --help and a bad stage build nothing and write no logs."""

    def gpu_check(self, *args):
        logs = os.path.join(os.path.dirname(GPU_CHECK), "..", "gpu-check-logs")
        had_logs = os.path.exists(logs)
        p = run(["bash", GPU_CHECK, *args], OUT=None)
        self.assertEqual(os.path.exists(logs), had_logs, "gpu-check-logs/ appeared")
        return p

    def test_help(self):
        for flag in ("--help", "-h"):
            with self.subTest(flag=flag):
                p = self.gpu_check(flag)
                self.assertEqual((p.returncode, p.stderr), (0, ""))
                self.assertIn("scripts/gpu-check.sh [all|STAGE[,STAGE...]]", p.stdout)
                self.assertIn("stages: test sanitize", p.stdout)
                self.assertFalse(p.stdout.startswith("#!"), p.stdout)

    def test_unknown_stage(self):
        p = self.gpu_check("nope")
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertIn("unknown stage 'nope'", p.stderr)


if __name__ == "__main__":
    unittest.main()
