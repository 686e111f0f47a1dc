"""The baselines page, its history page and plots, from records only (``pages.write_report``).

Records are this run's cells (``runs/results.csv`` and ``runs/curves.csv``, written by the
collect rule) and the committed records a matrix lists under ``recorded:``: CPU runs snapshotted
under ``baselines/cpu/{date}-{revision}/`` (``results.csv`` + ``curves.csv``) and GPU benchmark
records ``baselines/gpu/*.json`` (``easyr1 bench``). Every record has a *kind*, what it measures:
a cell (by name), or a benchmark's workload, backend, GPUs and settings. The page shows one
current row per kind, the latest; older ones go to the history page, and a current row more than
5% worse than the previous record of its kind on any headline metric is flagged. Each row names
the engine revision it ran with, flagged when the engine changed since. Output is byte-stable:
the same records give the same files.

Its modules, from the bottom: ``formatting`` (values as page text, tables, PNG bytes), ``rows``
(records read into one row per record), ``regressions`` (engine revisions, regression flags),
``cells`` (the CPU matrix's tables and curves), ``benchmarks`` (the GPU benchmark records' tables
and figures), ``pages`` (the pages themselves).
"""

import matplotlib

matplotlib.use("Agg")  # before any module of the package imports pyplot: the figures are files
