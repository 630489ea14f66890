"""The matched-budget comparison's default run (issue 15): target <= 3 minutes on 2 cores.

Run:  python -m pytest benchmarks/test_compare_builders.py --benchmark-columns=min,rounds
(one round: the default run of ``python -m analyses.compare_builders``, recorded in benchmarks/RESULTS.md).
"""


def test_compare_builders_default_run(benchmark, tmp_path):
    """9 settings (T = 0 and DDTE's eight) x 4 budgets x 9 builders, 4 training and 4 held-out roots."""
    from analyses import compare_builders

    benchmark.pedantic(compare_builders.main, args=(["--out", str(tmp_path), "--quiet"],), rounds=1, iterations=1)
