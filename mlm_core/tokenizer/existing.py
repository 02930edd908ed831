"""An existing tokenizer (``tokenizer.from``, else ``pretrain.init_from``): a folder -> a ``tokenizers.Tokenizer``
with its own special tokens.

Accepted folders (the first of ``FOLDER`` and ``FOLDER/hf`` that holds tokenizer files):
  * ``tokenizer.json`` (a Hugging Face ``tokenizers`` file: any model saved with ``save_pretrained``, a
    tokenizer stage output, a pretrain output, a registry download);
  * only the older Hugging Face files: ``vocab.txt`` (WordPiece, BERT), ``vocab.json`` + ``merges.txt``
    (byte-level BPE, RoBERTa), ``sentencepiece.bpe.model`` (XLM-R). These are converted by transformers
    (the reference implementation of that conversion, also for options such as do_lower_case), which is
    then needed at run time; the sentencepiece file also needs the ``sentencepiece`` package. Both are
    optional: the error says what to install. (Every BERT / RoBERTa / XLM-R release ships tokenizer.json,
    so the pipeline does not depend on them.)

Special tokens (roles pad/unk/cls/sep/mask, each with its id in this tokenizer), first found wins:
``manifest.json`` (a folder this pipeline wrote), ``special_tokens_map.json``, ``tokenizer_config.json``
(``<role>_token``; cls falls back to bos and sep to eos, as in RoBERTa/XLM-R), the converting transformers
tokenizer, then the conventional names ([PAD]... or <pad>...). Ids come from the tokenizer itself, so
XLM-R's ``<mask>`` (the last id) is found where it is. The role tokens are marked special in the written
tokenizer.json (ids unchanged), which is what the tokenizer contract and the HF export check.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from mlm_core.tokenizer.build import ROLES, TokenizerError

HF_FILES = {"vocab.txt": "BertTokenizer", "vocab.json": "RobertaTokenizer",
            "sentencepiece.bpe.model": "XLMRobertaTokenizer"}
# conventional names per role: BERT style, then RoBERTa / XLM-R style
_NAMES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>"),
          "sep": ("[SEP]", "</s>"), "mask": ("[MASK]", "<mask>")}
_FALLBACK_KEY = {"cls": "bos_token", "sep": "eos_token"}
_FAMILY_OF_CLASS = {"bert": "bert", "roberta": "roberta", "xlmroberta": "xlm-roberta", "electra": "electra"}
KINDS = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram", "WordLevel": "wordlevel"}


@dataclass
class Existing:
    """A loaded base tokenizer: the tokenizer, its role -> (token, id), where it came from."""

    tokenizer: Tokenizer
    specials: dict[str, tuple[str, int]]
    folder: Path                  # the folder the files were read from (FOLDER or FOLDER/hf)
    files: str                    # "tokenizer.json" or the converted Hugging Face files
    kind: str                     # wordpiece | bpe | unigram | wordlevel (the tokenizers model type)
    byte_level: bool              # byte-level pre-tokenizer / decoder (GPT-2 byte alphabet in the vocabulary)
    lowercase: bool
    family: str | None = None
    declared_in: dict[str, str] = field(default_factory=dict)   # role -> where its token was declared

    @property
    def size(self) -> int:
        """Ids in use: the largest id + 1 (added tokens included)."""
        return max(self.tokenizer.get_vocab(with_added_tokens=True).values()) + 1

    @property
    def surface(self) -> str:
        """How token strings map back to text (``stats.token_text``'s algorithm argument)."""
        return "bpe" if self.byte_level else "wordpiece" if self.kind == "wordpiece" else "unigram"

    @property
    def style(self) -> str:
        cls = self.specials["cls"][0]
        return "bert" if cls == "[CLS]" else "roberta" if cls == "<s>" else "custom"


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError as e:
        raise TokenizerError(f"{path}: not valid JSON ({e})") from None


def tokenizer_folder(folder: Path, field: str) -> Path:
    """``folder`` or its ``hf/`` subfolder (a pipeline pretrain output / registry download), whichever holds
    tokenizer files; TokenizerError naming ``field`` when neither does."""
    for cand in (folder, folder / "hf"):
        if (cand / "tokenizer.json").is_file() or any((cand / f).is_file() for f in HF_FILES):
            return cand
    raise TokenizerError(f"{field}: {folder} holds no tokenizer files (tokenizer.json, or Hugging Face "
                         f"{', '.join(HF_FILES)} with merges.txt next to vocab.json)")


def _find(tree, type_name: str) -> list[dict]:
    """Every component of a tokenizer.json part (normalizer, pre_tokenizer...) with this "type"."""
    if isinstance(tree, dict):
        return ([tree] if tree.get("type") == type_name else []) + [x for v in tree.values() for x in _find(v, type_name)]
    if isinstance(tree, list):
        return [x for v in tree for x in _find(v, type_name)]
    return []


def _convert(folder: Path, field: str) -> tuple[Tokenizer, dict[str, str]]:
    """tokenizer.json-less Hugging Face files -> (Tokenizer, role -> token) through transformers."""
    present = [f for f in HF_FILES if (folder / f).is_file()]
    if "vocab.json" in present and not (folder / "merges.txt").is_file():
        raise TokenizerError(f"{field}: {folder / 'vocab.json'} without merges.txt: a byte-level BPE tokenizer "
                             f"needs both (or give tokenizer.json)")
    if importlib.util.find_spec("transformers") is None:
        raise TokenizerError(f"{field}: {folder} has Hugging Face tokenizer files ({', '.join(present)}) but no "
                             f"tokenizer.json; converting them needs transformers: pip install "
                             f"'transformers>=5.24,<6' (or save the tokenizer with tokenizer.json)")
    if present == ["sentencepiece.bpe.model"] and importlib.util.find_spec("sentencepiece") is None:
        raise TokenizerError(f"{field}: {folder / 'sentencepiece.bpe.model'} is a SentencePiece model and the folder "
                             f"has no tokenizer.json; converting it needs the sentencepiece package: pip install "
                             f"'sentencepiece>=0.2,<0.3' (or save the tokenizer with tokenizer.json: "
                             f"AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER))")
    import transformers
    hf, errors = None, []
    if (folder / "tokenizer_config.json").is_file() or (folder / "config.json").is_file():
        try:   # the folder names its class: AutoTokenizer applies the options saved with it
            hf = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # noqa: BLE001 - fall back to the class the files imply
            errors.append(f"AutoTokenizer: {e}")
    if hf is None:
        cls = getattr(transformers, HF_FILES[present[0]])
        try:
            hf = cls.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{cls.__name__}: {e}")
            raise TokenizerError(f"{field}: transformers could not read the tokenizer files in {folder}: "
                                 + "; ".join(errors)) from e
    tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    declared = {role: str(getattr(hf, f"{role}_token")) for role in ROLES if getattr(hf, f"{role}_token", None)}
    return tok, declared


def _declared(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """role -> token as the folder's own files declare it, and role -> the file that declared it."""
    tokens: dict[str, str] = {}
    where: dict[str, str] = {}
    manifest = _json(folder / "manifest.json").get("special_tokens") or {}
    sources = [("manifest.json", {f"{r}_token": (v.get("token") if isinstance(v, dict) else None)
                                  for r, v in manifest.items()}),
               ("special_tokens_map.json", _json(folder / "special_tokens_map.json")),
               ("tokenizer_config.json", _json(folder / "tokenizer_config.json"))]
    for name, data in sources:
        for role in ROLES:
            if role in tokens:
                continue
            for key in (f"{role}_token", _FALLBACK_KEY.get(role)):
                v = data.get(key) if key else None
                v = v.get("content") if isinstance(v, dict) else v
                if isinstance(v, str) and v:
                    tokens[role], where[role] = v, f"{name} ({key})"
                    break
    return tokens, where


def resolve_specials(tok: Tokenizer, folder: Path, field: str, converted: dict[str, str] | None = None
                     ) -> tuple[dict[str, tuple[str, int]], dict[str, str]]:
    """role -> (token, id) for the five roles; TokenizerError naming the file for a declared token the
    tokenizer lacks, and the roles no file declares and no conventional name finds."""
    tokens, where = _declared(folder)
    for role, t in (converted or {}).items():
        if role not in tokens:
            tokens[role], where[role] = t, "transformers' tokenizer class"
    for role in ROLES:
        if role not in tokens:
            for name in _NAMES[role]:
                if tok.token_to_id(name) is not None:
                    tokens[role], where[role] = name, "conventional name"
                    break
    missing = [r for r in ROLES if r not in tokens]
    if missing:
        raise TokenizerError(f"{field}: {folder}: no {'/'.join(missing)} token: declare it in "
                             f"{folder / 'special_tokens_map.json'} (e.g. {{\"{missing[0]}_token\": \"...\"}}); "
                             f"the pipeline needs pad, unk, cls, sep and mask")
    out = {}
    for role in ROLES:
        tid = tok.token_to_id(tokens[role])
        if tid is None:
            raise TokenizerError(f"{field}: {folder}: {role} token {tokens[role]!r} (from {where[role]}) is not in "
                                 f"the tokenizer's vocabulary")
        out[role] = (tokens[role], tid)
    return out, where


def _family(folder: Path) -> str | None:
    for cand in (folder, folder.parent) if folder.name == "hf" else (folder,):
        mt = _json(cand / "config.json").get("model_type")
        if mt:
            return str(mt)
        if (cand / "model_config.json").is_file():   # this pipeline's own model (BERT-style unless it says)
            return str(_json(cand / "model_config.json").get("family") or "bert")
    cls = str(_json(folder / "tokenizer_config.json").get("tokenizer_class") or "").lower()
    cls = cls.removesuffix("fast").removesuffix("tokenizer")
    return _FAMILY_OF_CLASS.get(cls.replace("-", "").replace("_", ""))


def load_existing(folder: Path, field: str) -> Existing:
    """Read the tokenizer in ``folder`` (see the module docstring); errors name the file and ``field``."""
    folder = tokenizer_folder(Path(folder), field)
    converted = None
    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001 - the tokenizers error names no file
            raise TokenizerError(f"{field}: {folder / 'tokenizer.json'} is not a readable tokenizers file: {e}") from e
        files = "tokenizer.json"
    else:
        tok, converted = _convert(folder, field)
        files = "+".join(f for f in (*HF_FILES, "merges.txt") if (folder / f).is_file()) + " (converted by transformers)"
    data = json.loads(tok.to_str())
    kind = KINDS.get(data["model"].get("type"))
    if kind is None:
        raise TokenizerError(f"{field}: {folder}: unsupported tokenizer model {data['model'].get('type')!r} "
                             f"(supported: {', '.join(KINDS)})")
    specials, where = resolve_specials(tok, folder, field, converted)
    # role tokens must be special added tokens (kept whole in text, skipped in decoding); ids do not change
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, _ in specials.values()])
    moved = [r for r, (t, i) in specials.items() if tok.token_to_id(t) != i]
    if moved:   # pragma: no cover - add_special_tokens keeps the id of a token already in the vocabulary
        raise TokenizerError(f"{field}: {folder}: special token ids changed for {moved}")
    tok.no_truncation()
    tok.no_padding()
    byte_level = bool(_find(data.get("pre_tokenizer"), "ByteLevel") or _find(data.get("decoder"), "ByteLevel"))
    norm = data.get("normalizer")
    lowercase = bool(_find(norm, "Lowercase") or any(n.get("lowercase") for n in _find(norm, "BertNormalizer")))
    return Existing(tok, specials, folder, files, kind, byte_level, lowercase, _family(folder), where)


__all__ = ["Existing", "HF_FILES", "load_existing", "resolve_specials", "tokenizer_folder"]
