"""RESULTS.md's index and the study pages beside it (docs/results/<page>/README.md), as
`attnlab results` rewrites and checks them, and the paired bootstraps kept beside the
records (docs/results/runs/<study>/bootstrap.json)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import ROOT
from test_results import FIXTURE
from test_significance import study

from attnlab.commands.cli import main
from attnlab.compare import bootstraps
from attnlab.reports.results import archive, pages, regenerate_pages

PROBE = "<!-- results:probe_sample probe -->\n<!-- /results:probe_sample -->\n"
TRANSLATION = (
    "<!-- results:translation_sample configurations -->\n<!-- /results:translation_sample -->\n"
)
SYNTH = "<!-- results:synth configurations baseline=synthesizer=dot -->\n<!-- /results:synth -->\n"


def repository(tmp_path: Path, pages: dict[str, str]) -> Path:
    """A RESULTS.md without blocks, the pages named (their text), the fixture's records."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE / "docs" / "results" / "runs", root / "docs" / "results" / "runs")
    (root / "RESULTS.md").write_text("# Results\n\n| study | page |\n|---|---|\n")
    for name, text in pages.items():
        (root / "docs" / "results" / name).mkdir()
        (root / "docs" / "results" / name / "README.md").write_text(f"# {name}\n\n{text}")
    return root


def results(root: Path, *check: str) -> None:
    main(["results", "--file", str(root / "RESULTS.md"), *check])


def test_every_page_is_rewritten_and_checked_and_a_stale_block_is_named(tmp_path, capsys):
    root = repository(tmp_path, {"probe": PROBE, "translation": TRANSLATION})
    results(root)
    page = root / "docs" / "results" / "translation" / "README.md"
    assert "| none | 1 |" in page.read_text()
    assert (
        "| none | softmax | 2 |" in (root / "docs" / "results" / "probe" / "README.md").read_text()
    )
    results(root, "--check")
    assert "and its 2 study pages match their run records" in capsys.readouterr().out
    page.write_text(page.read_text().replace("| none | 1 |", "| NoPE | 1 |"))
    with pytest.raises(
        SystemExit,
        match=r"^attnlab: docs/results/translation/README\.md \(block "
        r"<!-- results:translation_sample configurations -->\) is out of date",
    ):
        results(root, "--check")


def test_a_figure_is_drawn_beside_its_page_and_linked_from_there(tmp_path):
    root = repository(tmp_path, {"probe": PROBE, "translation": TRANSLATION})
    results(root)
    figure = root / "docs" / "results" / "probe" / "probe_sample.png"
    assert figure.stat().st_size > 1000
    text = (root / "docs" / "results" / "probe" / "README.md").read_text()
    assert "![probe_sample: accuracy by position](probe_sample.png)" in text
    assert not list((root / "docs" / "results").glob("*.png")) and not list(root.glob("*.png"))


def test_a_figure_no_block_links_fails_the_check_and_is_removed_by_results(tmp_path):
    root = repository(tmp_path, {"probe": PROBE, "translation": TRANSLATION})
    results(root)
    drawn = root / "docs" / "results" / "probe" / "probe_sample.png"
    hand_made = root / "docs" / "results" / "probe" / "diagram.png"
    hand_made.write_bytes(b"a diagram drawn by hand")
    (root / "docs" / "results" / "probe" / "README.md").write_text("# probe\n\nNo block now.\n")
    with pytest.raises(SystemExit, match=r"probe/probe_sample\.png is linked by no block: run"):
        results(root, "--check")
    assert drawn.is_file(), "the check writes nothing"
    results(root)
    assert not drawn.exists() and hand_made.is_file(), "a figure not drawn by results stays"
    results(root, "--check")


def bootstrap_repository(tmp_path: Path) -> Path:
    study(tmp_path)
    root = tmp_path / "repo"
    archive(tmp_path / "runs", root / "docs" / "results" / "runs" / "synth")
    (root / "RESULTS.md").write_text("# Results\n")
    (root / "docs" / "results" / "mt").mkdir()
    (root / "docs" / "results" / "mt" / "README.md").write_text(SYNTH)
    return root


def refuse_sacrebleu(monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("sacreBLEU was called")

    monkeypatch.setattr("sacrebleu.significance.PairedTest", refused)


def test_results_keeps_each_bootstrap_beside_its_records_and_the_check_reads_it(
    tmp_path, monkeypatch
):
    root = bootstrap_repository(tmp_path)
    kept = root / "docs" / "results" / "runs" / "synth" / "bootstrap.json"
    text = regenerate_pages(root, draw=False).texts[root / "docs" / "results" / "mt" / "README.md"]
    assert not kept.exists(), "computing what the file lacks writes nothing"
    results(root)
    held = json.loads(kept.read_text())
    # 3 configurations × 3 seeds: 2 configurations against the baseline, seed by seed
    assert held["version"] == 1 and len(held["pairs"]) == 6
    assert (root / "docs" / "results" / "mt" / "README.md").read_text() == text
    refuse_sacrebleu(monkeypatch)
    results(root, "--check")  # every pair from the file: sacreBLEU is not called


def test_a_kept_bootstrap_is_not_used_once_the_hypotheses_change(tmp_path, monkeypatch):
    root = bootstrap_repository(tmp_path)
    results(root)
    kept = root / "docs" / "results" / "runs" / "synth" / "bootstrap.json"
    held = json.loads(kept.read_text())
    hypotheses = root / "docs" / "results" / "runs" / "synth" / "worse0" / "hypotheses" / "test.txt"
    hypotheses.write_text(hypotheses.read_text().replace("ein hund 0\n", "ein hund null\n"))
    refuse_sacrebleu(monkeypatch)
    with pytest.raises(AssertionError, match="sacreBLEU was called"):
        results(root, "--check")
    monkeypatch.undo()
    results(root)
    now = json.loads(kept.read_text())["pairs"]
    assert len(now) == 6 and len(set(held["pairs"]) & set(now)) == 5, "seed 0's pair computed anew"


@pytest.mark.parametrize(
    "text,why",
    [
        ("{", "not JSON"),
        ('{"version": 2, "pairs": {}}', "not a version 1 file"),
        ('{"version": 1, "pairs": {"synth/dot0": [1.0, 0.5]}}', "a key of another format"),
        ('{"version": 1, "pairs": {"KEY": [1.0, 1.5]}}', "is not a Δ BLEU and a p-value"),
        ('{"version": 1, "pairs": {"KEY": ["1.0", 0.5]}}', "is not a Δ BLEU and a p-value"),
    ],
)
def test_a_damaged_bootstrap_file_is_refused_in_one_sentence(tmp_path, text, why):
    root = bootstrap_repository(tmp_path)
    key = bootstraps.key(["a"], ["b"], ["c"], 1000, 12345)
    kept = root / "docs" / "results" / "runs" / "synth" / "bootstrap.json"
    kept.write_text(text.replace("KEY", key))
    with pytest.raises(SystemExit) as refused:
        results(root, "--check")
    message = str(refused.value)
    assert (
        message.startswith("attnlab: ")
        and "bootstrap.json is damaged (" in message
        and why in message
    )
    assert message.endswith("delete it and run `attnlab results` to rebuild it")
    assert "\n" not in message


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped."""
    headings = re.findall(r"^#+ (.*)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_each_link_of_the_index_and_the_study_pages_leads_to_a_file_and_its_heading():
    found = pages(ROOT)
    assert {page.parent.name for page in found[1:]} >= {"probe", "mechanisms"}
    for page in found:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            assert linked.is_file(), f"{page.relative_to(ROOT)} links {target}, which is missing"
            if anchor:
                assert anchor in heading_anchors(linked), f"{page.relative_to(ROOT)}: {target}"
