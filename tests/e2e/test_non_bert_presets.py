"""``optimize`` on a user's MPNet encoder (``hf:``, a small random one from :mod:`paretorch.testing.text_encoders`):
the presets that pack are skipped at the start, with the pack stage's reason naming the embeddings class, said once
(issue 46: the run counted them among "pair(s) skipped" without a word)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from paretorch.pipeline.cli.main import main
from paretorch.testing.text_encoders import save_text_encoder

pytestmark = pytest.mark.slow


def test_the_presets_line_says_once_why_pack_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paretorch.experiments.models.minilm import sentences

    directory = save_text_encoder("mpnet", tmp_path / "mpnet")
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(sentences("evaluation")[:24]), encoding="utf-8")
    code = main(["optimize", "--model", f"hf:{directory}", "--inputs-file", str(lines), "--results-dir",
                 str(tmp_path / "runs"), "--device", "cpu", "--runtimes", "eager,compile", "--trials", "1",
                 "--no-tracking", "--latency-budget", "quick", "--threads", "1", "--exports", "none"])
    out = capsys.readouterr().out
    assert code == 0, out
    presets = next((line for line in out.splitlines() if line.startswith("presets first")), "")
    skipped = presets.partition("skipped as they cannot run here: ")[2]
    assert skipped, presets
    pack = [reason for reason in re.split(r"; (?=\S+: )", skipped) if reason.startswith("pack:")]
    assert len(pack) == 1 and "this encoder's are MPNetEmbeddings" in pack[0], presets
    assert re.search(r"MPNetEmbeddings \((\d+)\)", pack[0]), "the pairs it skips are counted, not listed"
    assert out.count("MPNetEmbeddings") == 1, "said once, at the start"
