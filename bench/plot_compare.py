#!/usr/bin/env python3
"""Draws `attnkit-bench --compare ... --csv FILE` as an SVG: time against
prompt length, one line per variant (paged, ragged, varlen), one panel per
model and batch size. Solid lines are attention + scatter (the sum the bench
picks the winner by), dashed lines attention alone. Log-log axes.

    python3 bench/plot_compare.py compare.csv -o compare.svg
    python3 bench/plot_compare.py --self-test

Standard library only (csv, math, xml), so it runs wherever the bench ran.
"""
import argparse
import csv
import io
import math
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

COLORS = {"paged": "#1f77b4", "ragged": "#ff7f0e", "varlen": "#2ca02c"}
PANEL_W, PANEL_H = 360, 260
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 62, 14, 30, 42
COLUMNS = 4


def read_rows(f):
    """The rows that ran (status ok or fail) with their numbers as floats."""
    rows = []
    for r in csv.DictReader(f):
        if r.get("status") not in ("ok", "fail"):
            continue
        try:
            r["prompt_len"] = int(r["prompt_len"])
            r["batch"] = int(r["batch"])
            r["attn_ms"] = float(r["attn_ms"])
            r["sum_ms"] = float(r["sum_ms"])
        except (KeyError, ValueError):
            continue
        if r["attn_ms"] > 0 and r["sum_ms"] > 0:
            rows.append(r)
    return rows


def panels_of(rows):
    """{(model line, batch): {variant: [(prompt_len, attn_ms, sum_ms), ...]}}, in CSV order."""
    panels = {}
    for r in rows:
        title = "%s %s (%s/%s heads, d%s)" % (r["model"], r["dtype"], r["num_qo_heads"], r["num_kv_heads"],
                                             r["head_dim"])
        key = (title, r["batch"])
        panels.setdefault(key, {}).setdefault(r["variant"], []).append((r["prompt_len"], r["attn_ms"], r["sum_ms"]))
    for lines in panels.values():
        for pts in lines.values():
            pts.sort()
    return panels


def log_ticks(lo, hi):
    """1-2-5 ticks per decade covering [lo, hi]; every integer mantissa when
    that gives fewer than three (a range inside one decade)."""
    for mantissas in ((1, 2, 5), range(1, 10)):
        ticks = []
        e = math.floor(math.log10(lo))
        while 10 ** e <= hi:
            ticks += [m * 10 ** e for m in mantissas if lo <= m * 10 ** e <= hi]
            e += 1
        if len(ticks) >= 3:
            return ticks
    return ticks or [lo, hi]


def fmt(v):
    return ("%g" % v) if v >= 0.01 else ("%.0e" % v)


def panel_svg(x0, y0, title, batch, lines):
    out = []
    xs = sorted({p[0] for pts in lines.values() for p in pts})
    ys = [y for pts in lines.values() for p in pts for y in (p[1], p[2])]
    xlo, xhi = math.log2(xs[0]), math.log2(xs[-1])
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    ylo, yhi = math.log10(min(ys)) - 0.05, math.log10(max(ys)) + 0.05
    pw, ph = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B

    def px(x):
        return x0 + MARGIN_L + (math.log2(x) - xlo) / (xhi - xlo) * pw

    def py(y):
        return y0 + MARGIN_T + ph - (math.log10(y) - ylo) / (yhi - ylo) * ph

    out.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">%s, batch %d</text>'
               % (x0 + MARGIN_L + pw / 2, y0 + 16, escape(title), batch))
    out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>'
               % (x0 + MARGIN_L, y0 + MARGIN_T, pw, ph))
    for x in xs:
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>'
                   % (px(x), y0 + MARGIN_T, px(x), y0 + MARGIN_T + ph))
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%d</text>'
                   % (px(x), y0 + MARGIN_T + ph + 14, x))
    for y in log_ticks(10 ** ylo, 10 ** yhi):
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>'
                   % (x0 + MARGIN_L, py(y), x0 + MARGIN_L + pw, py(y)))
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="end">%s</text>'
                   % (x0 + MARGIN_L - 4, py(y) + 3, fmt(y)))
    out.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">prompt length (tokens)</text>'
               % (x0 + MARGIN_L + pw / 2, y0 + PANEL_H - 8))
    out.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">'
               'ms per layer</text>' % (x0 + 14, y0 + MARGIN_T + ph / 2, x0 + 14, y0 + MARGIN_T + ph / 2))
    for variant, pts in lines.items():
        color = COLORS.get(variant, "#555")
        for idx, dash in ((2, ""), (1, ' stroke-dasharray="4 3"')):
            coords = " ".join("%.1f,%.1f" % (px(p[0]), py(p[idx])) for p in pts)
            out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.6"%s/>' % (coords, color, dash))
        for p in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="2.2" fill="%s"/>' % (px(p[0]), py(p[2]), color))
    return out


def render(rows, title):
    panels = panels_of(rows)
    if not panels:
        raise ValueError("no rows that ran in the CSV")
    keys = list(panels)
    cols = min(COLUMNS, len(keys))
    nrows = (len(keys) + cols - 1) // cols
    legend_h = 40
    w, h = cols * PANEL_W, nrows * PANEL_H + legend_h
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">' % (w, h),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="18" font-size="14">%s</text>' % escape(title)]
    variants = []
    for lines in panels.values():
        for v in lines:
            if v not in variants:
                variants.append(v)
    x = 10
    for v in variants:
        out.append('<line x1="%d" y1="31" x2="%d" y2="31" stroke="%s" stroke-width="2"/>'
                   % (x, x + 22, COLORS.get(v, "#555")))
        out.append('<text x="%d" y="35" font-size="12">%s</text>' % (x + 26, escape(v)))
        x += 90
    out.append('<text x="%d" y="35" font-size="11" fill="#444">solid: attention + scatter (ak_kv_update); '
               'dashed: attention alone</text>' % (x + 10))
    for i, key in enumerate(keys):
        out.extend(panel_svg((i % cols) * PANEL_W, legend_h + (i // cols) * PANEL_H, key[0], key[1], panels[key]))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def synthetic_csv():
    """A small CSV shaped like the bench's, for --self-test (made-up numbers)."""
    f = io.StringIO()
    w = csv.writer(f)
    w.writerow(["device", "model", "num_qo_heads", "num_kv_heads", "head_dim", "dtype", "page_size", "batch",
                "prompt_len", "num_tokens", "layers", "variant", "backend", "status", "attn_ms", "scatter_ms",
                "sum_ms", "attn_tflops", "winner", "check", "max_rel_err", "reason"])
    for batch in (1, 4):
        for n in (128, 256, 512, 1024):
            for k, (variant, backend) in enumerate((("paged", "cuda_paged"), ("ragged", "cuda_paged"),
                                                    ("varlen", "cuda_varlen"))):
                attn = 1e-5 * batch * n * n * (1 + 0.05 * k) + 0.004
                scatter = 2e-6 * batch * n
                w.writerow(["test device, synthetic", "llama3-8b", 32, 8, 128, "bf16", 16, batch, n, batch * n, 4,
                            variant, backend, "ok", attn, scatter, attn + scatter, 1.0, int(k == 0), "off", "", ""])
    w.writerow(["test device, synthetic", "phi3-mini", 32, 32, 96, "bf16", 16, 1, 128, 128, 4, "varlen",
                "cuda_varlen", "skipped", "", 0.01, "", "", 0, "off", "", "head dims 96/96: needs ..."])
    f.seek(0)
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="?", help="attnkit-bench --compare ... --csv FILE output")
    ap.add_argument("-o", "--output", default="compare.svg", help="SVG to write (default compare.svg)")
    ap.add_argument("--title", default=None, help="title line (default: from the CSV's device)")
    ap.add_argument("--self-test", action="store_true", help="render a synthetic CSV and check the SVG parses")
    a = ap.parse_args()
    if a.self_test:
        svg = render(read_rows(synthetic_csv()), "self-test")
        root = ET.fromstring(svg)
        lines = [e for e in root.iter() if e.tag.endswith("polyline")]
        assert len(lines) == 2 * 3 * 2, len(lines)  # (sum, attention) x 3 variants x 2 batches
        print("plot_compare.py self-test: ok (%d bytes of SVG, %d lines)" % (len(svg), len(lines)))
        return 0
    if not a.csv:
        ap.error("a CSV file is needed (or --self-test)")
    with open(a.csv, newline="") as f:
        rows = read_rows(f)
    if not rows:
        print("plot_compare.py: %s has no rows that ran" % a.csv, file=sys.stderr)
        return 1
    title = a.title or "attnkit --compare on %s: time per layer vs prompt length" % rows[0].get("device", "?")
    with open(a.output, "w") as f:
        f.write(render(rows, title))
    print("wrote %s" % a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
