"""An ELECTRA pair trained here, REGISTERED in MLflow, then continued from its registry address (issue 11).

One module fixture: normalize -> tokenizer -> shards -> pretrain (objective electra, a fresh tiny pair) on the
en/ru fox corpus with tracking on (the SQLite store ``<workdir>/mlflow.db``); the pretrain output is registered
as the pretrain stage registers it (``tasks.registry.register_pretrained``: the transformers-flavor MLflow model,
the generator's ``hf/`` export as its ``model/``, ``hf-discriminator/`` next to it) and gets the alias ``champion``. A second config in the same workdir sets
``pretrain.init_from: models:/NAME@champion`` (objective electra) and runs the stages again.

The checks read the registered version independently of our loader: its files are downloaded here with
``mlflow.artifacts.download_artifacts`` (not through ``tasks.external``) and loaded with transformers'
``ElectraForMaskedLM`` / ``ElectraForPreTraining``. Plus `mlm compare models:/NAME@ALIAS <continued run>`, and
the import record covering the discriminator too (an edited one is downloaded again).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from test_init_from import hf_loss, hf_model, masked_rows, run_stages, write_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NAME, ALIAS = "electra-reg", "champion"
REF = f"models:/{NAME}@{ALIAS}"
# where the pretrain output's folders sit in the registered MLflow model (transformers flavor: the generator's
# export is its model/ folder)
REG_DIRS = {"hf": "model", "hf-discriminator": "hf-discriminator"}
FRESH = {"init_from": None, "objective": "electra", "electra": {"generator_fraction": 0.5},
         "model": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64, "max_positions": 64}}


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    """{"first", "second": stage artifacts, "version", "cfg", "lc", "registered": the version's files downloaded
    by MLflow itself}."""
    import flows  # noqa: F401 - installs the models:/ resolver, as every mlm command and flow does
    import mlflow

    from mlm_core.config.io import load_config
    from tasks import registry, tracking
    tmp = tmp_path_factory.mktemp("electra-registry")
    cfg = write_config(tmp, "unused", pretrain=FRESH, tracking={"experiment": "electra-reg"},
                       registry={"model_name": NAME},
                       tokenizer={"vocab_size": 300, "min_vocab_fraction": 0.1})
    first = run_stages(cfg)
    lc = load_config(cfg)
    tracker = tracking.Tracker(lc.config.tracking, lc.workdir)
    run_id = tracker.start_stage("pretrain", first["pretrain"].fingerprint)
    version = registry.register_pretrained(first["pretrain"], tracker, run_id, lc)
    tracking.set_alias(tracker, NAME, ALIAS, version)
    where = tracker.client.get_model_version_download_uri(NAME, str(version))
    registered = Path(mlflow.artifacts.download_artifacts(artifact_uri=where, dst_path=str(tmp / "registered"),
                                                          tracking_uri=tracker.uri, registry_uri=tracker.uri))
    second = run_stages(cfg, [f"pretrain.init_from={REF}"])
    return {"first": first, "second": second, "version": version, "cfg": cfg, "lc": lc, "tracker": tracker,
            "registered": registered}


def test_the_registered_version_is_the_electra_pair(continued):
    """What the registry holds: both halves, byte-equal to the first run's export, in their transformers classes."""
    reg, pre = continued["registered"], continued["first"]["pretrain"].path
    for sub, cls in (("hf", "ElectraForMaskedLM"), ("hf-discriminator", "ElectraForPreTraining")):
        folder = reg / REG_DIRS[sub]
        assert _sha(folder / "model.safetensors") == _sha(pre / sub / "model.safetensors"), sub
        assert type(hf_model(folder)).__name__ == cls


def test_the_stage_starts_from_exactly_the_registered_pair(continued):
    """Before any step, the model the continued stage builds (prepare -> build, what the loop trains) has the
    registered files' logits, read by transformers: the generator's MLM logits and the discriminator's
    replaced-token logits (< 1e-4), and the shared embedding table is the registered one."""
    import torch

    from mlm_core.config.io import load_config
    from mlm_core.train.init_from import build, prepare
    c = continued
    arts = c["second"]
    lc = load_config(c["cfg"], [f"pretrain.init_from={REF}"])
    model = build(lc.config.pretrain, prepare(lc, arts["shards"], arts["tokenizer"])).eval()
    gen_hf = hf_model(c["registered"] / REG_DIRS["hf"])
    disc_hf = hf_model(c["registered"] / REG_DIRS["hf-discriminator"])
    ids, att, _ = masked_rows(arts["shards"])
    seg, real = (att > 0).long(), att > 0
    with torch.no_grad():
        pairs = [(model.gen.full_logits(ids, seg), gen_hf(input_ids=ids, attention_mask=att).logits),
                 (model.disc.full_rtd_logits(ids, seg), disc_hf(input_ids=ids, attention_mask=att).logits)]
    for i, (mine, theirs) in enumerate(pairs):
        assert torch.allclose(mine[real], theirs[real], atol=1e-4), (i, float((mine - theirs)[real].abs().max()))
    assert torch.equal(model.disc.tok_emb.weight.detach(), disc_hf.get_input_embeddings().weight.detach())
    assert torch.equal(model.gen.tok_emb.weight.detach(), gen_hf.get_input_embeddings().weight.detach())


def test_it_imports_the_version_fingerprints_both_halves_and_exports_a_pair(continued):
    c = continued
    pre = c["second"]["pretrain"]
    man = pre.manifest
    assert man["init_from"]["ref"] == REF and man["init_from"]["family"] == "electra" and man["steps"] == 20
    imported = c["lc"].workdir / "imports" / "models" / NAME / f"v{c['version']}"
    rec = json.loads((imported / ".mlm-import.json").read_text())
    assert rec["version"] == c["version"] and rec["ref"] == REF
    gen_dir = imported / rec["model_dir"]            # the generator (hf/): what init_from resolves to
    assert gen_dir.name == "hf"
    assert _sha(gen_dir / "model.safetensors") == _sha(c["registered"] / REG_DIRS["hf"] / "model.safetensors")
    assert _sha(gen_dir.parent / "hf-discriminator" / "model.safetensors") == \
        _sha(c["registered"] / REG_DIRS["hf-discriminator"] / "model.safetensors")
    from mlm_core.config.io import load_config
    from mlm_core.external import content_hash
    from mlm_core.train.stage import pretrain_inputs
    fp_inputs = pretrain_inputs(load_config(c["cfg"], [f"pretrain.init_from={REF}"]))["init_from"]
    assert fp_inputs == {"content_hash": content_hash(c["registered"] / REG_DIRS["hf"]),
                         "discriminator_content_hash": content_hash(c["registered"] / REG_DIRS["hf-discriminator"])}
    assert type(hf_model(pre.path / "hf")).__name__ == "ElectraForMaskedLM"
    assert type(hf_model(pre.path / "hf-discriminator")).__name__ == "ElectraForPreTraining"


def test_continued_training_lowers_both_losses(continued):
    """On the training rows, computed with transformers on the registered pair (before) and the new export
    (after): the generator's MLM loss on a fixed masking, and the discriminator's replaced-token loss on a fixed
    corruption (every 5th real token swapped for another id drawn with a fixed seed)."""
    import torch
    c = continued
    reg, out = c["registered"], c["second"]["pretrain"].path
    batch = masked_rows(c["second"]["shards"])
    lb, la = hf_loss(hf_model(reg / REG_DIRS["hf"]), batch), hf_loss(hf_model(out / "hf"), batch)
    assert la < lb - 0.2, (lb, la)
    ids, att, labels = batch
    picked = labels != -100
    orig = torch.where(picked, labels, ids)
    g = torch.Generator().manual_seed(0)
    V = hf_model(reg / REG_DIRS["hf"]).config.vocab_size
    repl = torch.randint(5, V, orig.shape, generator=g)                 # above the 5 special ids
    repl = torch.where(repl == orig, 5 + (repl - 5 + 1) % (V - 5), repl)   # a replacement never equals the original
    corrupted = torch.where(picked, repl, orig)
    rtd = picked.long()             # transformers scores only attention_mask == 1 positions

    def disc_loss(folder):
        with torch.no_grad():
            return float(hf_model(folder)(input_ids=corrupted, attention_mask=att, labels=rtd).loss)
    db, da = disc_loss(reg / REG_DIRS["hf-discriminator"]), disc_loss(out / "hf-discriminator")
    assert da < db - 0.1, (db, da)


def test_mlm_compare_the_registered_pair_with_its_continuation(continued, tmp_path, capsys):
    """`mlm compare models:/NAME@ALIAS <continued run> --config ...`: both sides are scored (the generator: the
    pair's MLM), A is the registered version (linked by number), and 20 more steps lower pseudo-perplexity."""
    from flows.cli import main
    c = continued
    out = tmp_path / "cmp"
    code = main(["compare", REF, str(c["second"]["pretrain"].path), "--config", str(c["cfg"]),
                 "--set", "evaluate.pll_sentences=4", "--out", str(out), "--json"])
    got = json.loads(capsys.readouterr().out)
    assert code == 0 and (out / "compare.png").is_file()
    rows = {(r["metric"], r["lang"]): r for r in got["rows"]}
    for lang in ("en", "ru"):
        r = rows[("pseudo_perplexity", lang)]
        assert r["b"] < r["a"], r
    tags = c["tracker"].client.get_run(got["run_id"]).data.tags
    assert tags["model_a"] == REF and tags["model_a.version"] == str(c["version"])


def test_an_edited_imported_discriminator_is_downloaded_again(continued):
    """The import record covers both halves: a discriminator changed since the import (one flipped byte) is
    downloaded again on the next plan, and the fingerprint stays the registered pair's."""
    from mlm_core import stages
    from mlm_core.config.io import load_config
    c = continued
    lc = load_config(c["cfg"], [f"pretrain.init_from={REF}"])
    before = stages.plan(lc)["pretrain"].fingerprint
    imported = c["lc"].workdir / "imports" / "models" / NAME / f"v{c['version']}"
    rec = json.loads((imported / ".mlm-import.json").read_text())
    disc = (imported / rec["model_dir"]).parent / "hf-discriminator" / "model.safetensors"
    good = _sha(disc)
    data = bytearray(disc.read_bytes())
    data[-1] ^= 1
    disc.write_bytes(bytes(data))
    assert stages.plan(lc)["pretrain"].fingerprint == before
    assert _sha(disc) == good
