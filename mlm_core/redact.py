"""Redaction of secrets in anything printed or logged: URL credentials and secret-looking key=value pairs.

In: a string (an error message, a tracking URI, a ``--set`` override) or a params dict. Out: the same text
with ``scheme://user:***@host`` and ``password=***``. Why here: a tracking URI may carry credentials
(``http://user:pass@host``) and overrides may carry tokens; both were echoed in errors and MLflow params.
The user name stays (it helps to tell which account was used); only the secret part goes.
"""
from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@  (the password may not hold '@', '/', whitespace or quotes)
_URL_CRED = re.compile(r"(?P<pre>[A-Za-z][\w+.-]*://[^:/@\s'\"]*):(?P<pw>[^@/\s'\"]+)@")
_SECRET_WORDS = r"(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|credentials?|auth[_-]?string)"
# key=value / key: value / 'key': 'value' where the key names a secret
# the secret word must stand alone in the key (``api_token``, ``MLFLOW_TRACKING_PASSWORD``), not ``tokenizer``
_SECRET_KV = re.compile(rf"(?i)(?P<key>[\w.-]*?(?<![a-z]){_SECRET_WORDS}(?![a-z])[\w.-]*)(?P<q1>['\"]?)"
                        rf"(?P<sep>\s*[=:]\s*)"
                        rf"(?P<q2>['\"]?)(?P<val>[^\s'\",}}\]]+)")


def redact(text: object) -> str:
    """``text`` as a string with URL passwords and secret-looking values replaced by ``***``."""
    s = str(text)
    s = _URL_CRED.sub(lambda m: f"{m['pre']}:{MASK}@", s)
    return _SECRET_KV.sub(lambda m: f"{m['key']}{m['q1']}{m['sep']}{m['q2']}{MASK}", s)


def redact_obj(obj):
    """A copy of a JSON-like value (dicts, lists, strings) with every string redacted; a dict key that
    names a secret has its whole value masked."""
    if isinstance(obj, dict):
        return {k: (MASK if _SECRET_KV.fullmatch(f"{k}=x") and obj[k] not in (None, "") else redact_obj(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    if isinstance(obj, str):
        return redact(obj)
    return obj


__all__ = ["redact", "redact_obj", "MASK"]
