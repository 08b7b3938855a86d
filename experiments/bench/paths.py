"""Where the benchmarks write: the raw JSON results and the BENCHMARKS.md rendered from them."""

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MARKDOWN = Path(__file__).resolve().parents[2] / "BENCHMARKS.md"
