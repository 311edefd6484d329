"""tools/trace_summary.py on small synthetic traces whose costs are known by hand.

A kernel's cost is its end minus the latest end of the kernels before it (0 if earlier), so a
kernel that starts inside its predecessor (programmatic dependent launch) costs only what it
adds to the span.  The traces below are built so each cost is a round number.
"""
import csv
import io
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "trace_summary.py")
FIELDS = ["graph_id", "graph_node", "start_ns", "end_ns", "grid", "block", "name"]


def replays(graph, kernels, n, period=100_000):
    """n replays of one graph: kernels = [(node, name, grid, start_us, end_us)] relative to the replay."""
    rows = []
    for i in range(n):
        t0 = 1_000_000 + i * period
        for node, name, grid, s, e in kernels:
            rows.append({"graph_id": graph, "graph_node": node, "start_ns": t0 + s * 1000, "end_ns": t0 + e * 1000,
                         "grid": grid, "block": "(128,1,1)", "name": name})
    return rows


def run(rows, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
        path = f.name
    try:
        p = subprocess.run([sys.executable, TOOL, path, *args], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    return p.returncode, p.stdout


def table(out, first_cell):
    """The markdown rows of out whose first cell is first_cell, as lists of cells."""
    rows = []
    for line in io.StringIO(out):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    return rows


# decode-like graph: a product (0-10 us), a norm starting inside it (5-14), a second product (14-30)
STEP = [(1, "void q4_matmul_kernel<1, 2>(Params)", "(66,1,1)", 0, 10),
        (2, "void rmsnorm_kernel(float*)", "(1,1,1)", 5, 14),
        (3, "void q4_matmul_kernel<1, 2>(Params)", "(32,1,1)", 14, 30)]
# verify-like graph: the same kernels at another template argument and longer, plus a scatter
VERIFY = [(1, "void q4_matmul_kernel<8, 4>(Params)", "(66,1,1)", 0, 13),
          (2, "void rmsnorm_kernel(float*)", "(1,1,1)", 5, 16),
          (3, "void scatter_rows_kernel(float*)", "(8,1,1)", 16, 19),
          (4, "void q4_matmul_kernel<8, 4>(Params)", "(32,1,1)", 19, 40)]


class TraceSummary(unittest.TestCase):
    def test_costs_and_span(self):
        rc, out = run(replays(7, STEP, 6))
        self.assertEqual(rc, 0, out)
        self.assertIn("## graph 7: 3 kernels, 6 replays; median span 30.0 us, kernels 35.0 us, gaps -5.0 us", out)
        prod = {c[1]: c for c in table(out, "q4_matmul_kernel<1, 2>")}
        self.assertEqual(prod["(66,1,1)"][5], "10.0")  # cost: its own 10 us
        self.assertEqual(prod["(32,1,1)"][5], "16.0")  # 30 - 14
        norm = table(out, "rmsnorm_kernel")[0]
        self.assertEqual(norm[4], "9.00")  # duration 5..14
        self.assertEqual(norm[5], "4.0")  # cost: 14 - 10, what it adds to the span
        self.assertEqual(sum(float(r[5]) for r in table(out, "q4_matmul_kernel<1, 2>") + [norm]), 30.0)

    def test_min_replays(self):
        rc, out = run(replays(7, STEP, 3))
        self.assertEqual(rc, 0, out)
        self.assertNotIn("## graph 7", out)  # 3 replays < the default 5
        rc, out = run(replays(7, STEP, 3), "--min-replays", "3")
        self.assertIn("## graph 7: 3 kernels, 3 replays", out)

    def test_compare(self):
        rc, out = run(replays(2, STEP, 6) + replays(5, VERIFY, 6, period=200_000), "--compare", "2,5")
        self.assertEqual(rc, 0, out)
        self.assertIn("## graph 5 against graph 2: 4 / 3 kernels, 6 / 6 replays; span 40.0 / 30.0 us, 1.33x, +10.0 us",
                      out)
        # matched by family in launch order: each A kernel meets B's at <8, 4>
        first = [r for r in table(out, "q4_matmul_kernel<1, 2>") if r[1] == "(66,1,1)"][0]
        self.assertEqual(first[3:6], ["10.0", "13.0", "+3.0"])
        self.assertIn("q4_matmul_kernel<8, 4> (66,1,1)", first[6])
        second = [r for r in table(out, "q4_matmul_kernel<1, 2>") if r[1] == "(32,1,1)"][0]
        self.assertEqual(second[3:6], ["16.0", "21.0", "+5.0"])  # 40 - 19 against 30 - 14
        self.assertEqual(table(out, "rmsnorm_kernel")[0][3:6], ["4.0", "3.0", "-1.0"])  # 16 - 13 against 14 - 10
        only = table(out, "(only in B) scatter_rows_kernel")[0]
        self.assertEqual(only[3:6], ["0.0", "3.0", "+3.0"])
        deltas = [float(r[5]) for r in table(out, "q4_matmul_kernel<1, 2>") + table(out, "rmsnorm_kernel") + [only]]
        self.assertAlmostEqual(sum(deltas), 10.0)

    def test_compare_unknown_graph(self):
        rc, out = run(replays(2, STEP, 6), "--compare", "2,9")
        self.assertEqual(rc, 2)
        self.assertIn("no graph 9 in the trace", out)


if __name__ == "__main__":
    unittest.main()
