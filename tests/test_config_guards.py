"""Issue 24 items 5 and 7: a workdir that would scatter stage folders over / or the home folder is refused; a
language key YAML reads as a boolean (``no``: Norwegian) gets a message saying so and how to quote it."""
from __future__ import annotations

from pathlib import Path

import pytest

from mlm_core.config.io import ConfigError, load_config

SOURCES = {"en": {"paths": ["en.txt"]}}


@pytest.mark.parametrize("workdir", ["/", "~", "~/..", "/.."])
def test_workdir_at_root_or_home_is_refused(workdir):
    resolved = str(Path(workdir).expanduser().resolve())
    with pytest.raises(ConfigError) as e:
        load_config(raw={"workdir": workdir, "sources": SOURCES})
    msg = str(e.value)
    assert "\n  workdir: " in msg                   # the key, at the start of its line
    assert f"resolves to {resolved}," in msg


def test_workdir_home_via_set_is_refused(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text("workdir: .mlm\nsources:\n  en: {paths: [en.txt]}\n")
    with pytest.raises(ConfigError, match=r"workdir: .* resolves to " + str(Path.home().resolve())):
        load_config(f, [f"workdir={Path.home()}"])


def test_ordinary_workdirs_pass(tmp_path):
    assert load_config(raw={"workdir": str(tmp_path / "w"), "sources": SOURCES}).workdir == tmp_path / "w"
    assert load_config(raw={"workdir": ".mlm", "sources": SOURCES}).config.workdir == ".mlm"


def test_norwegian_key_read_as_boolean_names_the_word_and_the_quotes(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text(f"workdir: {tmp_path / 'w'}\nsources:\n  en: {{paths: [en.txt]}}\n  no: {{paths: [no.txt]}}\n"
                 "audit:\n  crows_pairs: {off: a.csv}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "YAML read the key `no` as false" in msg
    assert '`"no":`' in msg
    assert "YAML read the key `off` as false" in msg
    assert "Input should be a valid string" not in msg
    # quoted, it is a language like any other
    f.write_text(f"workdir: {tmp_path / 'w'}\nsources:\n  en: {{paths: [en.txt]}}\n  \"no\": {{paths: [no.txt]}}\n")
    assert load_config(f).config.languages == ["en", "no"]
